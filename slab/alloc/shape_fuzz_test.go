package alloc

import (
	"errors"
	"math"
	"testing"
)

// FuzzAllocatorShapesMatchModel runs the model check over pool shapes whose free sets span
// several bit-tree levels and partial words (the fixed 3×5 shape of FuzzAllocatorMatchesModel
// never leaves the first word).
func FuzzAllocatorShapesMatchModel(f *testing.F) {
	f.Add(uint8(2), uint8(3), []byte{0, 1, 0, 23, 0, 2, 1, 23, 3, 1, 0, 0})
	f.Add(uint8(1), uint8(5), []byte{0, 1, 0, 23, 0, 2, 0, 23, 0, 3, 0, 23, 2, 2, 0, 0})
	shapes := []int{1, 2, 63, 64, 65, 127, 128, 129, 4097}
	f.Fuzz(func(t *testing.T, slabs, shape uint8, data []byte) {
		per := shapes[int(shape)%len(shapes)]
		ops := decodeOps(data)
		for i := range ops { // larger reservations to reach the upper levels
			if ops[i].kind == opReserve && ops[i].k > 0 {
				ops[i].k *= 1 + per/64
			}
		}
		if err := runAgainstModel(1+int(slabs)%4, per, ops); err != nil {
			t.Fatal(err)
		}
	})
}

func TestReserveOfHugeCountIsTooLargeNotNoSpace(t *testing.T) {
	for _, slabs := range []int{1, 2, 3, 8} {
		a := mustAlloc(t, slabs, 4)
		for _, k := range []int{math.MaxInt, math.MaxInt - 1, math.MaxInt - slabs + 1} {
			_, err := a.Reserve(1, 0, k)
			if !errors.Is(err, ErrTooLarge) {
				t.Errorf("slabs %d: Reserve(k=%d) = %v, want ErrTooLarge (it can never fit)", slabs, k, err)
			}
		}
	}
}
