package model

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// dropAbsentMTP removes m's MTP layers when the checkpoint in dir holds no
// tensor of the first of them (model.layers.<decoder layers>.*): a
// config.json may list num_nextn_predict_layers for weights that were not
// saved (transformers' save_pretrained drops them), and such a model has no
// MTP head, so drafts are refused as for any model without one.
func dropAbsentMTP(m *spec.Model, dir string) error {
	if m.NumNextN == 0 {
		return nil
	}
	names, err := checkpointNames(dir)
	if err != nil {
		return err
	}
	prefix := "model.layers." + strconv.Itoa(len(m.Layers)-m.NumNextN) + "."
	for _, n := range names {
		if strings.HasPrefix(n, prefix) {
			return nil
		}
	}
	m.Layers = m.Layers[:len(m.Layers)-m.NumNextN]
	m.NumNextN = 0
	return nil
}

// checkpointNames returns the tensor names of dir's weights: the keys of
// model.safetensors.index.json's weight_map, else of model.safetensors'
// header.
func checkpointNames(dir string) ([]string, error) {
	if data, err := os.ReadFile(filepath.Join(dir, "model.safetensors.index.json")); err == nil {
		var idx struct {
			WeightMap map[string]string `json:"weight_map"`
		}
		if err := json.Unmarshal(data, &idx); err != nil {
			return nil, fmt.Errorf("checkpoint %s: model.safetensors.index.json: %w", dir, err)
		}
		var names []string
		for n := range idx.WeightMap {
			names = append(names, n)
		}
		return names, nil
	}
	path := filepath.Join(dir, "model.safetensors")
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", dir, err)
	}
	defer f.Close()
	var size uint64
	if err := binary.Read(f, binary.LittleEndian, &size); err != nil {
		return nil, fmt.Errorf("checkpoint %s: model.safetensors header: %w", dir, err)
	}
	const maxHeader = 100 << 20
	if size > maxHeader {
		return nil, fmt.Errorf("checkpoint %s: model.safetensors header of %d bytes exceeds %d", dir, size, maxHeader)
	}
	hdr := make([]byte, size)
	if _, err := io.ReadFull(f, hdr); err != nil {
		return nil, fmt.Errorf("checkpoint %s: model.safetensors header: %w", dir, err)
	}
	var h map[string]json.RawMessage
	if err := json.Unmarshal(hdr, &h); err != nil {
		return nil, fmt.Errorf("checkpoint %s: model.safetensors header: %w", dir, err)
	}
	var names []string
	for n := range h {
		if n != "__metadata__" {
			names = append(names, n)
		}
	}
	return names, nil
}

// CheckpointMTPLayers returns the MTP layers the checkpoint in dir holds:
// its config.json's num_nextn_predict_layers, or 0 when its weights hold
// none of them (LoadCheckpoint's rule). A model may run fewer (speculative
// decoding off drops them), and a loader then allows the rest unread.
func CheckpointMTPLayers(dir string) (int, error) {
	m, err := LoadCheckpoint(dir)
	if err != nil {
		return 0, err
	}
	return m.NumNextN, nil
}
