package kernelspec_test

import (
	"errors"
	"testing"

	"github.com/kvx-dev/kvx/device/kernelspec"
	"github.com/kvx-dev/kvx/plugins/model"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// TestRowBytesMatchFillBuffers: the kernels' row and state widths are the
// bytes plugins/model.FillBuffers sizes the managers' pools with.
func TestRowBytesMatchFillBuffers(t *testing.T) {
	for _, tc := range []struct {
		kv, ssm, conv string
		tp            int
	}{{"bf16", "float32", "float32", 1}, {"fp8", "bfloat16", "bf16", 2}, {"bf16", "bf16", "float32", 4}} {
		m := spec.Model{Name: "synthetic", Hidden: 64, Heads: 8, KVHeads: 2, HeadDim: 64,
			KVLoraRank: 64, QKNopeHeadDim: 32, QKRopeHeadDim: 16, VHeadDim: 32,
			IndexHeads: 4, IndexHeadDim: 32, IndexTopK: 16,
			MambaHeads: 16, MambaHeadDim: 32, SSMStateSize: 64, NGroups: 2, ConvKernel: 4,
			Layers: []spec.Layer{{Index: 0, Mixer: spec.MixerGQA}, {Index: 1, Mixer: spec.MixerMLA}, {Index: 2, Mixer: spec.MixerDSA}, {Index: 3, Mixer: spec.MixerMamba}}}
		if err := model.FillBuffers(&m, model.Dtypes{KV: tc.kv, SSM: tc.ssm, Conv: tc.conv}, tc.tp); err != nil {
			t.Fatal(err)
		}
		kvDt, err1 := kernelspec.ParseDtype(tc.kv)
		ssmDt, err2 := kernelspec.ParseDtype(tc.ssm)
		convDt, err3 := kernelspec.ParseDtype(tc.conv)
		if err := errors.Join(err1, err2, err3); err != nil {
			t.Fatal(err)
		}
		kvh := max(m.KVHeads/tc.tp, 1)
		g := kernelspec.GQA{Heads: m.Heads / tc.tp, KVHeads: kvh, HeadDim: m.HeadDim, Dtype: kvDt}
		mla := kernelspec.MLA{Heads: m.Heads / tc.tp, KVLoraRank: m.KVLoraRank, QKNopeHeadDim: m.QKNopeHeadDim, QKRopeHeadDim: m.QKRopeHeadDim, VHeadDim: m.VHeadDim, Dtype: kvDt}
		ix := kernelspec.Indexer{Heads: m.IndexHeads, HeadDim: m.IndexHeadDim, TopK: m.IndexTopK}
		mb := kernelspec.Mamba2{Heads: m.MambaHeads / tc.tp, HeadDim: m.MambaHeadDim, State: m.SSMStateSize,
			Groups: max(m.NGroups/tc.tp, 1), ConvKernel: m.ConvKernel, ConvDtype: convDt, SSMDtype: ssmDt}
		for _, c := range []struct {
			name      string
			got, want int64
		}{
			{"gqa kv", int64(g.RowBytes()), m.Layers[0].Buffers[0].BytesPerToken},
			{"mla latent", int64(mla.RowBytes()), m.Layers[1].Buffers[0].BytesPerToken},
			{"dsa latent", int64(mla.RowBytes()), m.Layers[2].Buffers[0].BytesPerToken},
			{"dsa index key", int64(ix.RowBytes()), m.Layers[2].Buffers[1].BytesPerToken},
			{"mamba conv", int64(mb.ConvBytes()), m.Layers[3].Buffers[0].BytesPerSeq},
			{"mamba ssm", int64(mb.SSMBytes()), m.Layers[3].Buffers[1].BytesPerSeq},
		} {
			if c.got != c.want {
				t.Errorf("%+v %s: kernel %d bytes, FillBuffers %d", tc, c.name, c.got, c.want)
			}
		}
		if err := errors.Join(g.Validate(), mla.Validate(), ix.Validate(), mb.Validate()); err != nil {
			t.Error(err)
		}
	}
	if _, err := kernelspec.ParseDtype("fp4"); !errors.Is(err, kernelspec.ErrInvalid) {
		t.Errorf("ParseDtype(fp4) = %v, want ErrInvalid", err)
	}
}
