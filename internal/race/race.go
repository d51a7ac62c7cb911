// Package race says whether the race detector is built in (go test -race,
// make test-race), so that a test whose work runs on one goroutine can
// leave that work to the plain pass, where it runs in a tenth of the time,
// and the race pass spends its time where there is concurrency to race.
package race
