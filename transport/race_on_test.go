//go:build race

package transport

// raceEnabled: the race detector changes what allocates.
const raceEnabled = true
