// Package soaktest is the soak of kvx serve under plugin faults
// (TestServeSoak, issue 24): the built kvx binary and its plugins as
// processes, driven over HTTP. It has no code of its own. It is a package
// apart from cmd/kvx's tests so that it imports nothing of the engine: go
// test links and starts it while the rest of the tree still compiles, and
// its minute of load runs beside the other packages instead of after them.
package soaktest
