package main

// listenTries bounds the loops in which a test's client retries a server
// that is not listening yet, each try 10 to 20 ms apart: up to 10 to 20 s,
// what a server started in a goroutine can take under -race on a loaded
// machine (50 tries, one second, were not always enough).
const listenTries = 1000
