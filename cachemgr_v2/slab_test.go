package cachemgrv2

import (
	"reflect"
	"slices"
	"testing"
)

// TestNodePointersKept pins nodeSlab's soundness argument: the slab's node
// chunks are memory the GC does not scan, so every field of Node that holds
// a pointer must point to something kept alive elsewhere, and nodeSlab's
// doc comment names its keeper. A pointer field added to Node (or to a
// struct inside it) fails here until it has one and is listed below.
func TestNodePointersKept(t *testing.T) {
	kept := []string{"parent", "tokens", "children.first", "children.more", "pages", "salt"}
	var got []string
	var walk func(typ reflect.Type, prefix string)
	walk = func(typ reflect.Type, prefix string) {
		for i := range typ.NumField() {
			f := typ.Field(i)
			switch f.Type.Kind() {
			case reflect.Struct:
				walk(f.Type, prefix+f.Name+".")
			case reflect.Array:
				if hasPointers(f.Type.Elem()) {
					got = append(got, prefix+f.Name)
				}
			default:
				if hasPointers(f.Type) {
					got = append(got, prefix+f.Name)
				}
			}
		}
	}
	walk(reflect.TypeOf(Node{}), "")
	if !slices.Equal(got, kept) {
		t.Errorf("Node's pointer fields = %v, want %v (each kept alive as nodeSlab's comment says)", got, kept)
	}
}

// hasPointers reports whether a value of typ holds a pointer the GC follows.
func hasPointers(typ reflect.Type) bool {
	switch typ.Kind() {
	case reflect.Pointer, reflect.Slice, reflect.Map, reflect.String, reflect.Interface, reflect.Chan, reflect.Func, reflect.UnsafePointer:
		return true
	case reflect.Array:
		return typ.Len() > 0 && hasPointers(typ.Elem())
	case reflect.Struct:
		for i := range typ.NumField() {
			if hasPointers(typ.Field(i).Type) {
				return true
			}
		}
	}
	return false
}
