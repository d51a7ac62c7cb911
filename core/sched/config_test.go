package sched

import (
	"errors"
	"flag"
	"os"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// TestMain raises rapid's default number of checks (100) to 1000 unless
// -rapid.checks or RAPID_CHECKS says otherwise: a run takes tens of
// microseconds.
func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "rapid.checks" })
	if _, env := os.LookupEnv("RAPID_CHECKS"); !set && !env {
		if err := flag.Set("rapid.checks", "1000"); err != nil {
			panic(err)
		}
	}
	os.Exit(m.Run())
}

func validConfig() Config {
	return Config{
		MaxBatchSize: 4, MaxResident: 8, MaxNumTokens: 64, MaxSeqLen: 256, MaxSeqTokens: 256,
		ChunkedPrefill: true, TokensPerBlock: 16, Draft: 1, Policy: MaxUtilization,
	}
}

func TestNewValidates(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Config)
		want []string // substrings of the error; nil = no error
	}{
		{"valid", func(*Config) {}, nil},
		{"batch", func(c *Config) { c.MaxBatchSize = 0 }, []string{"MaxBatchSize", "= 0", ">= 1"}},
		{"resident", func(c *Config) { c.MaxResident = 3 }, []string{"MaxResident", "= 3", "MaxBatchSize 4"}},
		{"tpb", func(c *Config) { c.TokensPerBlock = 0 }, []string{"TokensPerBlock", "= 0", ">= 1"}},
		{"draft", func(c *Config) { c.Draft = -1 }, []string{"Draft", "= -1", ">= 0"}},
		{"tokens vs draft", func(c *Config) { c.MaxNumTokens, c.TokensPerBlock, c.Draft = 3, 1, 3 },
			[]string{"MaxNumTokens", "= 3", "1 + Draft = 4"}},
		{"tokens vs block", func(c *Config) { c.MaxNumTokens = 8 }, []string{"MaxNumTokens", "= 8", "TokensPerBlock 16"}},
		{"seqlen", func(c *Config) { c.MaxSeqLen = 1 }, []string{"MaxSeqLen", "= 1", ">= 2"}},
		{"seqtokens", func(c *Config) { c.MaxSeqTokens = 2 }, []string{"MaxSeqTokens", "= 2", "below 3"}},
		{"policy", func(c *Config) { c.Policy = 7 }, []string{"Policy", "= 7"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := validConfig()
			tt.edit(&cfg)
			s, err := New(cfg)
			if tt.want == nil {
				if err != nil || s == nil {
					t.Fatalf("New(%+v) = %v, %v; want a scheduler", cfg, s, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("New(%+v) = nil error, want one naming %q", cfg, tt.want)
			}
			if !errors.Is(err, kvcache.ErrInvalidConfig) {
				t.Errorf("New(%+v) = %v, want kind %v", cfg, err, kvcache.KindInvalidConfig)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("New(%+v) = %q, want it to contain %q", cfg, err, w)
				}
			}
		})
	}
}

func TestParsePolicy(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want Policy
		err  string
	}{
		{"GUARANTEED_NO_EVICT", GuaranteedNoEvict, ""},
		{"MAX_UTILIZATION", MaxUtilization, ""},
		{"STATIC_BATCH", 0, "not supported"},
		{"max_utilization", 0, "unknown"},
		{"", 0, "unknown"},
	} {
		got, err := ParsePolicy(tt.in)
		if tt.err == "" {
			if err != nil || got != tt.want {
				t.Errorf("ParsePolicy(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
			}
			if got.String() != tt.in {
				t.Errorf("%v.String() = %q, want %q", got, got.String(), tt.in)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tt.err) || !errors.Is(err, kvcache.ErrInvalidConfig) {
			t.Errorf("ParsePolicy(%q) = %v, %v; want an invalid-config error containing %q", tt.in, got, err, tt.err)
		}
	}
}
