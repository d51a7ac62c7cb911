package model

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/kvx-dev/kvx/plugins/model/tok"
)

// SyntheticEOS is the end-of-sequence id of the synthetic models' byte
// tokenizer (tok.ByteEOS: 256 bytes, BOS 256, EOS 257).
const SyntheticEOS = tok.ByteEOS

// maxEOSFile bounds the generation_config.json and config.json read for
// eos_token_id (a real one is a few KiB).
const maxEOSFile = 16 << 20

// EOSTokenIDs returns the end-of-sequence ids of the Hugging Face
// checkpoint directory dir, as transformers' generate and vLLM take them:
// generation_config.json's eos_token_id when that file sets one, else
// config.json's; each an id or a list of ids, null or absent for none. An
// id outside [0, vocab) or of the wrong type is an error naming the file.
func EOSTokenIDs(dir string, vocab int) ([]int32, error) {
	for _, name := range []string{"generation_config.json", "config.json"} {
		path := filepath.Join(dir, name)
		ids, set, err := eosOf(path, vocab)
		if err != nil {
			return nil, err
		}
		if set {
			return ids, nil
		}
	}
	return nil, nil
}

// eosOf reads one file's eos_token_id; set is false when the file or the
// key is absent, or the key is null.
func eosOf(path string, vocab int) (ids []int32, set bool, err error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > maxEOSFile {
		return nil, false, fmt.Errorf("%s: %d bytes, more than the %d read for eos_token_id", path, st.Size(), maxEOSFile)
	}
	var doc struct {
		EOS json.RawMessage `json:"eos_token_id"`
	}
	if err := json.NewDecoder(f).Decode(&doc); err != nil {
		return nil, false, fmt.Errorf("%s: %v", path, err)
	}
	if len(doc.EOS) == 0 || string(doc.EOS) == "null" {
		return nil, false, nil
	}
	var list []int64
	var one int64
	if err := json.Unmarshal(doc.EOS, &one); err == nil {
		list = []int64{one}
	} else if err := json.Unmarshal(doc.EOS, &list); err != nil {
		return nil, false, fmt.Errorf("%s: eos_token_id %s: want a token id or a list of token ids", path, doc.EOS)
	}
	for _, id := range list {
		if id < 0 || id >= int64(vocab) {
			return nil, false, fmt.Errorf("%s: eos_token_id %d: outside the vocabulary [0, %d)", path, id, vocab)
		}
		ids = append(ids, int32(id))
	}
	return ids, true, nil
}
