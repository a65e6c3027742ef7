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
// names the first differing byte. It compares whole words and looks at bytes only in the word
// that differs, so a check costs about what FillKV does.
func CheckKV(b []byte, pageHash uint64, index, shard int) error {
	x := seed(pageHash, index, shard)
	i := 0
	for ; i+8 <= len(b); i += 8 {
		x += 0x9e3779b97f4a7c15
		if want := mix.Mix64(x); binary.LittleEndian.Uint64(b[i:]) != want {
			return mismatch(b[i:i+8], want, i, pageHash, index, shard)
		}
	}
	if i < len(b) {
		x += 0x9e3779b97f4a7c15
		return mismatch(b[i:], mix.Mix64(x), i, pageHash, index, shard)
	}
	return nil
}

// mismatch names the first byte of word (at offset off of the page, up to 8 bytes) that
// differs from want's little-endian bytes; nil when none does.
func mismatch(word []byte, want uint64, off int, pageHash uint64, index, shard int) error {
	var w [8]byte
	binary.LittleEndian.PutUint64(w[:], want)
	for j := range word {
		if word[j] != w[j] {
			return fmt.Errorf("kvtest: page %d (hash %#x, shard %d): byte %d is %#02x, want %#02x", index, pageHash, shard, off+j, word[j], w[j])
		}
	}
	return nil
}
