// Package pipeline is the host side of contract v1's per-step calls: how
// the engine drives the stages of a pipeline in as few round trips as the
// transport allows. No plugin author implements anything here; an author
// implements kvcache.Manager (and kvcache.Suspender) or worker.Worker, and
// that is all.
//
// Its parts:
//
//   - step.go: ending a step on a stage in one call (StepEnder, EndStep)
//     and starting calls without waiting for their answers (StepStarter,
//     CallStarter, SuspendStarter and the Start* functions), so the calls
//     the engine makes on every stage share one write to a plugin process.
//   - chain.go: a forward over several stages in one call (Chainer,
//     ChainStarter, ForwardStages, StartForwardStages, StageError), so a
//     step's forward wakes a worker process once, not once per stage.
//
// The interfaces are optional, found by type assertion on a manager or a
// worker: the plugin clients of plugins/v1/pluginrpc implement them, and
// every function falls back to the plain contract calls for a value that
// does not, with the same results. The core uses only these functions and
// the contract's interfaces, so it cannot tell an in-process manager or
// worker from a plugin.
package pipeline
