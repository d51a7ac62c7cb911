package model

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestEOSTokenIDs: generation_config.json's eos_token_id wins over
// config.json's; an id or a list; null or absent means none; a bad value
// names the file.
func TestEOSTokenIDs(t *testing.T) {
	for _, tc := range []struct {
		name      string
		gen, conf string // file contents; "" for no file
		want      []int32
		err       string
	}{
		{"none", "", "", nil, ""},
		{"config int", "", `{"eos_token_id": 2}`, []int32{2}, ""},
		{"config list", "", `{"eos_token_id": [128001, 128008, 128009]}`, []int32{128001, 128008, 128009}, ""},
		{"generation wins", `{"eos_token_id": [7, 9]}`, `{"eos_token_id": 2}`, []int32{7, 9}, ""},
		{"generation null falls back", `{"eos_token_id": null}`, `{"eos_token_id": 3}`, []int32{3}, ""},
		{"generation without the key", `{"do_sample": true}`, `{"eos_token_id": 4}`, []int32{4}, ""},
		{"config null", "", `{"eos_token_id": null}`, nil, ""},
		{"out of vocab", "", `{"eos_token_id": 200000}`, nil, "config.json: eos_token_id 200000: outside the vocabulary [0, 150000)"},
		{"wrong type", `{"eos_token_id": "</s>"}`, "", nil, `generation_config.json: eos_token_id "</s>": want a token id or a list`},
		{"not json", `{`, "", nil, "generation_config.json"},
	} {
		dir := t.TempDir()
		for name, body := range map[string]string{"generation_config.json": tc.gen, "config.json": tc.conf} {
			if body != "" {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
					t.Fatal(err)
				}
			}
		}
		got, err := EOSTokenIDs(dir, 150000)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: error %v, want one containing %q", tc.name, err, tc.err)
		case tc.err == "" && err != nil:
			t.Errorf("%s: error %v", tc.name, err)
		case !slices.Equal(got, tc.want):
			t.Errorf("%s: EOSTokenIDs = %v, want %v", tc.name, got, tc.want)
		}
	}
}
