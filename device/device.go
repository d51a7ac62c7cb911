// Package device is the worker runtime shared by every attention backend, and
// the seam between that runtime and the device that runs the kernels.
//
// Its parts, and the failure each one prevents:
//
//   - Backend (dsa, dsa/mla, gqa) says what runs: the layer mixers it runs,
//     the Kernel that runs each one, and its sim cost. Devices switch on the
//     Kernel answer and never on a backend's name, so a new backend (or a
//     DSA model run densely through the mla backend) needs no edit here and
//     cannot silently run a kernel it did not choose.
//   - Worker (NewWorker) does what every backend needs the same way: it
//     checks the config against the backend, keeps the block tables the
//     cache manager granted (Tables), validates every item before anything
//     runs, carries activations between stages, and on the last stage of a
//     modelled device samples tokens and MTP drafts. A malformed batch is a
//     request-scoped error, never a kernel reading the wrong blocks.
//   - Device runs the stage's layers, picked by Config.Device: sim (no
//     memory, no math: a roofline cost model, package sim; built in), cpu
//     (pure-Go reference kernels on real pools, package cpu, added with
//     WithDevice("cpu", cpu.Open): the bit-exact oracle every manager is
//     checked against) and cuda (package cuda, behind the cuda build tag:
//     the same models on CUDA kernels, in the exact numerics, the cpu's bits,
//     or the fast deterministic bf16 ones; docs/cuda.md).
//
// A device that computes returns the next stage's activations and the last
// stage's samples itself (Pass). A device that only models time (sim) returns
// neither; the runtime then hands on placeholder activations (a tag per item
// that the next stage checks, so reordered or mixed batches are caught) and
// samples placeholder tokens that depend only on (Seed, Seq, position), never
// on the batch, the process or the order of calls, so replays are
// reproducible and A/B comparisons see the same tokens.
package device

import (
	"context"
	"fmt"

	"github.com/kvx-dev/kvx/device/sim"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// Version is the worker runtime's version, reported by Info.
const Version = "0.1.0"

// Backend is an attention backend: the layer mixers it runs and their cost.
// Implementations are stateless values, safe for concurrent use.
type Backend interface {
	// Name is the backend's config name ("dsa", "mla", "gqa"); Configure
	// refuses a Config.Backend other than this.
	Name() string
	// Mixers lists the layer mixers it runs. A stage whose layers need a
	// mixer not listed here is refused at Configure. The caller may not
	// modify the slice.
	Mixers() []spec.Mixer
	// Kernel says which kernel runs layers of mixer m on a computing device
	// (cpu, cuda): the backend chooses, the device runs its implementation
	// of that kernel. It is KernelNone for MixerNone and for a mixer not in
	// Mixers, and not KernelNone for any other mixer Mixers lists. It must
	// be pure.
	Kernel(m spec.Mixer) Kernel
	// MixerWork adds to w the work on one rank of layer l's mixer for batch
	// b, for the sim device: the mixer's weight matmuls, its attention (or
	// scan) and its cache reads and writes. l.Mixer is one that Mixers lists,
	// never MixerNone. FFN, embeddings, LM head and all-reduce are the
	// runtime's (package sim helpers). It must be pure and must not retain l
	// or b.
	MixerWork(e *sim.Env, l *spec.Layer, b *sim.Batch, w *sim.Work)
}

// Kernel is a token-mixing kernel a computing device implements. A backend
// picks one per layer mixer (Backend.Kernel); devices switch on it and never
// on the backend's name, so a new backend needs no change in a device as
// long as it runs kernels the devices have. The values are append-only.
type Kernel uint8

const (
	KernelNone   Kernel = iota // no token mixer (an FFN-only layer)
	KernelGQA                  // grouped-query attention, with the layer's sliding window
	KernelMLA                  // dense multi-head latent attention, absorbed form
	KernelDSA                  // DSA: lightning indexer top-k, then sparse MLA
	KernelMamba2               // the Mamba2 selective-state-space mixer
	// KernelGDN is Qwen3-Next's Gated DeltaNet. No backend names it: plugins/model
	// maps GDN layers onto the Mamba mixer (same state buffers), and the
	// computing devices run KernelGDN where the backend chose KernelMamba2
	// for a layer of a Qwen3-Next model (paged.NewMixer).
	KernelGDN
)

var kernelNames = [...]string{"none", "gqa", "mla", "dsa", "mamba2", "gdn"}

func (k Kernel) String() string {
	if int(k) < len(kernelNames) {
		return kernelNames[k]
	}
	return fmt.Sprintf("Kernel(%d)", uint8(k))
}

// Device runs a configured stage's layers: the seam between the runtime and
// the kernels (sim cost model, cpu reference kernels, cuda). The runtime has
// validated the batch and applied its Released sequences and table deltas to
// t before it calls Forward; the device must not retain b or t. Calls come
// from one goroutine at a time.
//
// What may influence an output: a computing device's tokens, logits and
// activations for an item's row r depend only on the weights (Seed), the
// kernels the backend chose, and the tokens at positions 0..Pos+r of the
// item's own sequence, read in logical order through its tables; never on
// how the sequence was chunked, on physical block placement, on the batch's
// order or its other items, or on the process. (A modelled device's time
// depends on the whole batch; its placeholder tokens only on (Seed, Seq,
// position).)
type Device interface {
	// Modelled reports whether Forward's time is modelled (sim) rather than
	// measured.
	Modelled() bool
	// Forward runs b's copies, then its layers. Pass.Nanos is the device time,
	// including any copies CopyBlocks queued since the last Forward. A
	// modelled device leaves Pass.Hidden and Pass.Outputs nil; a computing
	// device fills Hidden on every stage but the last and Outputs on the last
	// (one per item that samples, in item order), checks b.Hidden itself
	// (an error of kind KindInvalidArg when it does not fit the items), and
	// verifies drafts for real instead of drawing acceptance.
	Forward(ctx context.Context, b *worker.Batch, t *Tables) (Pass, error)
	// CopyBlocks runs (or queues) block copies that the runtime validated.
	CopyBlocks(ctx context.Context, copies []kvcache.Copy) error
}

// Pass is what one Forward of a device produced. The runtime hands Hidden
// and Outputs to its caller, who owns them.
type Pass struct {
	Nanos   int64
	Hidden  []byte          // computing devices, every stage but the last
	Outputs []worker.Output // computing devices, last stage
	// Prompt are the prompt rows of the items that asked
	// (worker.Item.PromptLogprobs); computing devices, last stage.
	Prompt []worker.PromptLogprobs
}

// Stage is what a device learns at Configure, already validated: the config
// (its slices are the caller's: copy what you keep), the backend, the stage's
// layers (a slice of cfg.Model.Layers) and the pools in layout order, without
// their Layers (the runtime keeps none of the caller's slices; a device that
// needs them reads Config.Layout.Pools).
type Stage struct {
	Config  *worker.Config
	Backend Backend
	Layers  []spec.Layer
	Pools   []kvcache.Pool
}

// OpenFunc makes the device for one Configure.
type OpenFunc func(s Stage) (Device, error)

// Option configures NewWorker.
type Option func(*Worker)

// WithDevice makes Config.Device name open the device, replacing any device
// of that name (the built-in "sim" included). Tests use it to swap in a fake
// device; the cpu and cuda devices will arrive this way.
func WithDevice(name string, open OpenFunc) Option {
	return func(w *Worker) { w.devices[name] = open }
}
