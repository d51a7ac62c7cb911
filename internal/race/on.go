//go:build race

package race

// Enabled reports whether the race detector is built in.
const Enabled = true
