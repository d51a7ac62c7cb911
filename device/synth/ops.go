package synth

import (
	"context"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// Tensor is a row-major matrix of Rows × Cols float32 values that a device
// owns: host memory on the cpu device, GPU memory on cuda. The model never
// reads its elements; only Ops.ToHost and Ops.Argmax bring values to the
// host. A Tensor is a handle: it is valid only with the Ops (or another Ops
// of the same device) that made it.
type Tensor interface {
	Rows() int
	Cols() int
}

// Routing is one MoE call's choice of experts for every row (Ops.Route),
// owned by the device like a Tensor.
type Routing interface {
	// Rows returns the number of rows routed.
	Rows() int
}

// Seg is one sequence's rows in a mixer call: Rows consecutive rows of the
// call's tensors, for the tokens at logical positions Pos..Pos+Rows-1 of
// sequence Seq (Pos is the sequence's history before this step, as
// worker.Item.Pos).
type Seg struct {
	Seq  kvcache.SeqID
	Pos  int
	Rows int
	// Draft is how many of the trailing rows are unverified draft tokens.
	// Their cache entries are provisional: attention rewrites them when a
	// later step writes the same positions (the next step starts at the
	// first rejected position); a state mixer (Mamba2) must keep the state
	// after each draft row so that the next call's Pos, which says how many
	// rows were kept, can pick it.
	Draft int
}

// MLAIn are the inputs of an MLA (or DSA) call, one row per token in segment
// order: QNope (Heads × qk_nope_head_dim), QPE (Heads × qk_rope_head_dim,
// not yet rotated), CKV (the normed latent, kv_lora_rank) and KPE (the rope
// key, not yet rotated). Scale, when not 0, is the softmax scale in place
// of 1/sqrt(qk_nope_head_dim + qk_rope_head_dim) (a checkpoint's yarn
// mscale²); the synthetic model leaves it 0.
type MLAIn struct {
	QNope, QPE, CKV, KPE Tensor
	Scale                float32
}

// IndexIn are the lightning indexer's inputs of a DSA call: Q (index_heads ×
// index_head_dim), K (index_head_dim) and W (index_heads, already scaled).
// Scale, when not 0, multiplies every head's q·k inside the ReLU
// (transformers' index_head_dim^-0.5); it is for the indexer layout that
// stores keys unquantized (kernelspec.Indexer.Plain), which a checkpoint's
// layers get, and the synthetic model leaves it 0.
type IndexIn struct {
	Q, K, W Tensor
	Scale   float32
}

// MLAWeights are the absorbed up projections of kv_b_proj: UK (Heads ×
// qk_nope_head_dim rows of kv_lora_rank) and UV (Heads × v_head_dim rows of
// kv_lora_rank).
type MLAWeights struct{ UK, UV Tensor }

// Mamba2In are the Mamba2 inputs, one row per token: Z (d_inner), XBC (conv
// dim) and DT (heads), the parts of in_proj's output.
type Mamba2In struct{ Z, XBC, DT Tensor }

// Mamba2Weights are a Mamba2 layer's own parameters: the depthwise conv
// (conv dim rows of conv_kernel taps) and its bias, dt_bias, A (negative),
// D and the gated norm's gains.
type Mamba2Weights struct{ ConvW, ConvB, DtBias, A, D, NormW Tensor }

// Loader puts a model's weights on a device (New draws them through it).
type Loader interface {
	// Weight makes a rows × cols tensor of row-major data, kept as long as
	// the device.
	Weight(data []float32, rows, cols int) Tensor
}

// RoPE is rotary position embedding: for a row at position pos, the first
// Dim elements of every head (heads Stride elements apart) are rotated by
// angles pos·Theta^(-2i/Dim), pairs (x[2i], x[2i+1]) when Interleaved
// (GPT-J, DeepSeek) and (x[i], x[i+Dim/2]) otherwise (GPT-NeoX, Llama).
//
// InvFreq, when set, holds the Dim/2 frequencies in place of
// Theta^(-2i/Dim) (the scaled variants: llama3, yarn), and Scale, when not
// 0, multiplies every cosine and sine (yarn's attention factor); the
// synthetic model uses neither. InvFreq is shared: nobody modifies it.
type RoPE struct {
	Dim         int
	Theta       float64
	Interleaved bool
	InvFreq     []float64
	Scale       float64
}

// RowOps are the row-wise operations of Ops: everything but the mixer
// kernels, which need the device's cache.
type RowOps interface {
	Loader
	// FromHost makes a rows × cols activation tensor of row-major data.
	FromHost(data []float32, rows, cols int) Tensor
	// ToHost returns t's elements, row-major.
	ToHost(t Tensor) []float32
	// Zeros makes a rows × cols tensor of zeros.
	Zeros(rows, cols int) Tensor

	// Embed returns row tokens[i] of table as row i.
	Embed(table Tensor, tokens []int32) Tensor
	// Rows returns rows idx of x, in idx order.
	Rows(x Tensor, idx []int) Tensor
	// Split cuts every row of x into groups consecutive groups of
	// sum(widths) columns, and returns for each width the parts of that
	// width, groups × width columns per row, in group order.
	Split(x Tensor, groups int, widths ...int) []Tensor
	// Concat returns the rows of a followed by the rows of b: [a | b].
	Concat(a, b Tensor) Tensor

	// MatMul returns x · wᵀ: x is n × k, w is m × k (a linear layer's
	// weight), the result n × m, each element one dot product.
	MatMul(x, w Tensor) Tensor
	// RMSNorm returns every row of x RMS-normalized (epsilon eps) and
	// multiplied by the gains w (1 × Cols).
	RMSNorm(x, w Tensor, eps float32) Tensor
	// Add sets dst += src element-wise.
	Add(dst, src Tensor)
	// Scale sets x *= s element-wise.
	Scale(x Tensor, s float32)
	// SwiGLU returns silu(gate) · up element-wise.
	SwiGLU(gate, up Tensor) Tensor
	// ReLU2 returns max(x, 0)² element-wise.
	ReLU2(x Tensor) Tensor
	// RoPE rotates x in place, every head of stride elements of each row,
	// row j of a segment at position Pos+j of its sequence (segs cover
	// x's rows in order).
	RoPE(x Tensor, segs []Seg, stride int, r RoPE)

	// Route picks every row's k experts from its router logits: softmax,
	// the k most probable (the lowest index among equals), renormalized.
	Route(logits Tensor, k int) Routing
	// Gather returns the rows of x routed to expert e, in row order; nil
	// when no row was.
	Gather(x Tensor, r Routing, e int) Tensor
	// AddRouted adds, for the i-th row routed to expert e, its routing
	// weight times row i of y to that row of acc. Called for ascending e,
	// it sums each row's experts in ascending expert order.
	AddRouted(acc, y Tensor, r Routing, e int)

	// Argmax returns, per row, the column of the largest element (the
	// lowest among equals; -1 for an all-NaN row): greedy sampling.
	Argmax(x Tensor) []int32
}

// Ops is what a device gives the model: the operations a synthetic model's
// forward is written in, once, for every device. The cpu device implements
// it with the reference kernels of device/cpu/kernel; a cuda device
// implements the same operations with GPU kernels and keeps every Tensor in
// GPU memory, so only tokens, logits and a stage's activations cross to the
// host.
//
// # What may influence an output
//
// The row-wise ops (MatMul, RMSNorm, Add, Scale, SwiGLU, ReLU2, RoPE, Split,
// Concat, Embed, Rows, Route, Gather, AddRouted, Argmax) compute each output
// row from the matching input row alone (and the weights; RoPE from the
// row's position too): never from the other rows, how many rows the call
// has or their order, each element in one fixed order (the cpu's kernel.Dot
// order for every dot product, no fused multiply-add). The mixer kernels
// (GQA, MLA, DSA, Mamba2) are causal instead: row r of a segment, at logical
// position Pos+r of its own sequence, depends only on the inputs at
// positions 0..Pos+r of that sequence (written by this call or earlier
// ones, read back in logical order), never on how the sequence was chunked,
// on physical block placement, on the batch order or on the other sequences
// of the call.
// That contract is what keeps tokens bit-identical across managers, chunk
// sizes, batches, pipeline splits and devices.
//
// # Ownership and goroutines
//
// Weight keeps a tensor for the lifetime of the device; every other tensor an
// op returns is new and the caller's, valid until the step (the device's
// Forward) that made it returns, and aliases no input. Ops mutate only the
// tensors they say they mutate (Add, Scale, RoPE, AddRouted's acc); they never
// retain an argument past the call. Host slices passed in (Weight, FromHost)
// become the device's; host slices returned (ToHost, Argmax) are the
// caller's. The model calls an Ops from one goroutine at a time; an
// implementation may use many internally. Shape mismatches are programmer
// errors and panic; the mixer kernels return errors (a problem of one
// sequence as a *kvcache.Error with Seqs set).
type Ops interface {
	RowOps

	// The mixer kernels of layer (an index in spec.Model.Layers) on the
	// layer's cache, for segs (their rows in order). Each returns the
	// kernel's output, one row per input row (Heads × head_dim for GQA,
	// Heads × v_head_dim for MLA and DSA, d_inner for Mamba2). The device
	// knows the layer's cache layout and kernel configuration. Queries and
	// keys come rotated (RoPE): the kernels cache keys as they get them.
	GQA(ctx context.Context, layer int, segs []Seg, q, k, v Tensor) (Tensor, error)
	MLA(ctx context.Context, layer int, segs []Seg, in MLAIn, w MLAWeights) (Tensor, error)
	DSA(ctx context.Context, layer int, segs []Seg, in MLAIn, ix IndexIn, w MLAWeights) (Tensor, error)
	Mamba2(ctx context.Context, layer int, segs []Seg, in Mamba2In, w Mamba2Weights) (Tensor, error)
}
