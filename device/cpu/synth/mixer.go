package synth

import (
	"context"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// Seg is one sequence's rows in a Mixer call: Rows consecutive rows of the
// call's in and out, for the tokens at logical positions Pos..Pos+Rows-1 of
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

// Mixer runs the token-mixing part of mixer layers (GQA, MLA, DSA, Mamba2):
// the part that reads and writes a cache. The cpu device implements it over
// paged kernels and block tables; a dense reference implements it over whole
// sequences. The model calls it once per mixer layer per step (and once per
// MTP depth on the last stage), never per sequence.
//
// Mix reads in, the RMSNorm-ed hidden rows (len = total rows × Hidden, the
// segs' rows in order), and writes out, the mixer's output in the residual
// stream (same shape; out is zeroed by the caller and does not alias in).
// layer is the index in spec.Model.Layers. The mixer owns its projections,
// drawn from Weights under LayerName(layer)+"mixer.".
//
// Contract that keeps outputs bit-identical across batching, chunking and
// stage splits: row r's output depends only on the inputs at the positions
// 0..Pos+r of its own sequence (written by this or earlier calls), in
// logical order, never on the other rows of the call, on how the sequence
// was chunked, or on physical block placement. Mix must not retain in, out
// or segs. Calls come from one goroutine at a time. An error aborts the
// step; a problem of one sequence should be a *kvcache.Error with Seqs set.
type Mixer interface {
	Mix(ctx context.Context, layer int, segs []Seg, in, out []float32) error
}
