package cuda

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/hashicorp/go-hclog"
)

// A CUDA context that saw a kernel fault (an illegal or misaligned address,
// an illegal instruction, a trap, an uncorrectable ECC error) is lost:
// every later call on it fails with the same error. Nor is a step whose
// memory ran out worth retrying in place. The worker then exits, and kvx
// does what it does for any worker that died: it starts another and
// recomputes every request in flight (core/engine's restart path). Other
// errors (a bad argument, an item a request cannot run) stay errors of the
// call.

// lostResults are the CUresults after which the worker exits: code, the
// name gorgonia.org/cu prints for it, and what it means.
var lostResults = []struct {
	code     int
	cu, what string
}{
	{2, "OutOfMemory", "out of memory"},
	{214, "EccUncorrectable", "uncorrectable ECC error"},
	{700, "IllegalAddress", "illegal address"},
	{702, "LaunchTimeout", "launch timeout"},
	{710, "Assert", "device-side assert"},
	{714, "HardwareStackError", "hardware stack error"},
	{715, "IllegalInstruction", "illegal instruction"},
	{716, "MisalignedAddress", "misaligned address"},
	{717, "InvalidAddressSpace", "invalid address space"},
	{718, "InvalidPc", "invalid program counter"},
	{719, "LaunchFailed", "launch failed"},
}

// resultError is a CUresult that is not CUDA_SUCCESS.
type resultError struct {
	code int
	name string
}

func (e *resultError) Error() string {
	if e.name == "" {
		return fmt.Sprintf("CUresult %d", e.code)
	}
	return fmt.Sprintf("%s (CUresult %d)", e.name, e.code)
}

// lostContext reports why err leaves the worker no way on but to exit, or
// "" when it does not: a CUresult of lostCodes from kvx's own calls
// (resultError) or from gorgonia.org/cu's (whose errors print as the
// result's name).
func lostContext(err error) string {
	if err == nil {
		return ""
	}
	var re *resultError
	isResult := errors.As(err, &re)
	msg := err.Error()
	for _, l := range lostResults {
		if (isResult && re.code == l.code) || (!isResult && strings.Contains(msg, l.cu)) {
			return l.what
		}
	}
	return ""
}

// exitLost ends the worker process after a lost context's error, saying so
// through the plugin's logger, which writes the stderr kvx reads (kvx logs
// it). Not os.Stderr: plugin.Serve has replaced that by a pipe that
// go-plugin streams to the host, and what is still in it when the process
// exits is lost (a worker that died of this gave kvx no reason).
func exitLost(why string, err error) {
	hclog.Default().Error(fmt.Sprintf("cuda: %s (%v): the CUDA context is lost; the worker exits so that kvx starts another and recomputes its requests", why, err))
	os.Exit(3)
}

// faultEnv names the fault injection of the cuda worker, for tests of GPU
// faults (scripts/gpu-run.sh, step faults): "KIND:N[:FILE]" makes the N-th
// Forward (from 1) of the process fail as KIND does, once: with FILE, only
// while FILE does not exist (it is created when the fault fires), so the
// worker that replaces this one runs clean. Kinds: illegal (a kernel
// stores to an unmapped address: CUDA_ERROR_ILLEGAL_ADDRESS at the step's
// synchronization) and oom (the step asks for 2^62 bytes of device memory:
// CUDA_ERROR_OUT_OF_MEMORY from the driver). Its name says what it is;
// nothing but a test sets it.
const faultEnv = "CUDA_KVX_FAULT"

// fault is a parsed CUDA_KVX_FAULT.
type fault struct {
	kind    string
	forward int
	once    string
}

// parseFault reads CUDA_KVX_FAULT's value ("" for none).
func parseFault(s string) (*fault, error) {
	if s == "" {
		return nil, nil
	}
	parts := strings.SplitN(s, ":", 3)
	if len(parts) < 2 {
		return nil, fmt.Errorf("cuda: %s=%q: want KIND:N[:FILE] (KIND illegal or oom, N >= 1)", faultEnv, s)
	}
	f := &fault{kind: parts[0]}
	if f.kind != "illegal" && f.kind != "oom" {
		return nil, fmt.Errorf("cuda: %s=%q: kind %q: want illegal or oom", faultEnv, s, f.kind)
	}
	n, err := strconv.Atoi(parts[1])
	if err != nil || n < 1 {
		return nil, fmt.Errorf("cuda: %s=%q: forward %q: want an integer >= 1", faultEnv, s, parts[1])
	}
	f.forward = n
	if len(parts) == 3 {
		f.once = parts[2]
	}
	return f, nil
}
