package kvtest

import (
	"encoding/binary"
	"fmt"

	"github.com/cpcache/cpcache/internal/mix"
)

func seed(pageHash uint64, index, shard int) uint64 {
	return mix.Mix64(pageHash ^ mix.Mix64(uint64(index)+0x632be59bd9b4e019) ^ uint64(shard)<<48)
}

// FillKV writes the content of sequence page index (chained hash pageHash) for shard (the
// rank's tensor-parallel index; 0 without TP) into dst.
func FillKV(dst []byte, pageHash uint64, index, shard int) {
	x := seed(pageHash, index, shard)
	i := 0
	for ; i+8 <= len(dst); i += 8 {
		x += 0x9e3779b97f4a7c15
		binary.LittleEndian.PutUint64(dst[i:], mix.Mix64(x))
	}
	if i < len(dst) {
		var tail [8]byte
		x += 0x9e3779b97f4a7c15
		binary.LittleEndian.PutUint64(tail[:], mix.Mix64(x))
		copy(dst[i:], tail[:])
	}
}

// CheckKV verifies that b holds FillKV's content for (pageHash, index, shard); the error
// names the first differing byte.
func CheckKV(b []byte, pageHash uint64, index, shard int) error {
	x := seed(pageHash, index, shard)
	var want [8]byte
	for i := 0; i < len(b); i += 8 {
		x += 0x9e3779b97f4a7c15
		binary.LittleEndian.PutUint64(want[:], mix.Mix64(x))
		for j := 0; j < 8 && i+j < len(b); j++ {
			if b[i+j] != want[j] {
				return fmt.Errorf("kvtest: page %d (hash %#x, shard %d): byte %d is %#02x, want %#02x", index, pageHash, shard, i+j, b[i+j], want[j])
			}
		}
	}
	return nil
}
