//go:build race

package main

// raceEnabled: the race detector slows the large tests tenfold.
const raceEnabled = true
