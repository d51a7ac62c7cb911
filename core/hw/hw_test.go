package hw

import (
	"slices"
	"strings"
	"testing"
)

func TestNamesSortedAndLookupable(t *testing.T) {
	names := Names()
	if want := []string{"b200", "h100", "h200"}; !slices.Equal(names, want) {
		t.Fatalf("Names() = %v, want %v", names, want)
	}
	for _, n := range names {
		h, err := Lookup(n)
		if err != nil {
			t.Fatalf("Lookup(%q) error %v", n, err)
		}
		if h.Name != n {
			t.Errorf("Lookup(%q).Name = %q", n, h.Name)
		}
		if !h.Uncalibrated {
			t.Errorf("Lookup(%q).Uncalibrated = false, want true (datasheet values)", n)
		}
		if h.MemoryBytes <= 0 || h.MemBandwidth <= 0 || h.FLOPSBF16 <= 0 || h.FLOPSFP8 < h.FLOPSBF16 ||
			h.NVLinkBW <= 0 || h.PCIeBW <= 0 || h.PCIeBW >= h.NVLinkBW || h.LaunchLatency <= 0 ||
			!(h.CopyLatency > 0 && h.CopyLatency < 1e-4) {
			t.Errorf("Lookup(%q) = %+v: implausible figures", n, h)
		}
	}
}

func TestPresetFigures(t *testing.T) {
	tests := []struct {
		name       string
		mem        int64
		bw, bf, f4 float64
	}{
		{"h200", 141e9, 4.8e12, 989e12, 0},
		{"H100", 80e9, 3.35e12, 989e12, 0},
		{" b200 ", 180e9, 8e12, 2250e12, 9000e12},
	}
	for _, tt := range tests {
		h, err := Lookup(tt.name)
		if err != nil {
			t.Fatalf("Lookup(%q): %v", tt.name, err)
		}
		if h.MemoryBytes != tt.mem || h.MemBandwidth != tt.bw || h.FLOPSBF16 != tt.bf || h.FLOPSFP4 != tt.f4 {
			t.Errorf("Lookup(%q) = %+v, want mem %d bw %g bf16 %g fp4 %g", tt.name, h, tt.mem, tt.bw, tt.bf, tt.f4)
		}
	}
}

func TestLookupUnknownListsNames(t *testing.T) {
	_, err := Lookup("a100")
	if err == nil {
		t.Fatal("Lookup(a100) = nil error")
	}
	want := `unknown hardware "a100"; known: b200, h100, h200`
	if err.Error() != want {
		t.Errorf("Lookup(a100) error = %q, want %q", err, want)
	}
	if !strings.Contains(err.Error(), "h200") {
		t.Error("error does not list names")
	}
}

func TestLookupReturnsCopy(t *testing.T) {
	h, _ := Lookup("h200")
	h.MemoryBytes = 1
	h2, _ := Lookup("h200")
	if h2.MemoryBytes == 1 {
		t.Error("Lookup returned a shared value")
	}
}
