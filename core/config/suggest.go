package config

import "strings"

// suggest returns the known key nearest to raw (canonical keys, aliases,
// shorthands and ignored keys) and whether it is close enough to be a likely
// typo. A candidate whose last segment equals raw's last segment wins (the
// key was put in the wrong section), then a candidate that raw is a prefix
// of; otherwise the smallest Levenshtein distance wins, ties going to the alphabetically first key.
func suggest(raw string) (string, bool) {
	leaf := raw[strings.LastIndexByte(raw, '.')+1:]
	best, bestD := "", -1
	consider := func(k string) {
		if k == raw {
			return
		}
		d := levenshtein(raw, k)
		switch {
		case k[strings.LastIndexByte(k, '.')+1:] == leaf:
			d = 0
		case strings.HasPrefix(k, raw):
			d = min(d, 1) // a truncated key
		}
		if bestD < 0 || d < bestD || (d == bestD && k < best) {
			best, bestD = k, d
		}
	}
	for _, f := range fields {
		consider(f.key)
	}
	for a := range aliases {
		consider(a)
	}
	for _, ig := range ignoredKeys {
		consider(ig)
	}
	return best, bestD <= max(3, len(raw)/3)
}

// levenshtein is the edit distance between a and b, in bytes (keys are ASCII).
func levenshtein(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
