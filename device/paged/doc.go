// Package paged is what the computing devices (cpu, cuda) share about a
// stage before any kernel runs: the kernel configuration of every mixer
// layer (Mixer: the backend's Kernel choice with the layer's dimensions
// and cache dtypes, checked against its buffers' widths) and where each
// layer's buffers live in the manager's layout (Place: the pool, the byte
// offset inside a block and the row stride; the live and snapshot state
// slots of Mamba layers). Both devices address the pools through these, so
// a layout one device accepts the other reads the same way.
//
// The in-block layout: every pool is Blocks × BlockBytes bytes. A paged
// pool's block holds, for each layer of Pool.Layers in order and each of
// that layer's paged buffers in order, TokensPerBlock × BytesPerToken bytes
// (token row stride BytesPerToken); a state pool's block (TokensPerBlock 0)
// holds, for each layer in order, its conv then its ssm state. Row formats
// are the cpu kernels' (kernelspec.GQA, kernelspec.MLA, kernelspec.Indexer,
// kernelspec.Mamba2, kernelspec.GDN).
package paged
