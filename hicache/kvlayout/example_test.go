package kvlayout_test

import (
	"fmt"

	"github.com/cpcache/cpcache/hicache/kvlayout"
)

func ExampleParse() {
	l, err := kvlayout.Parse("llama-3-8b")
	if err != nil {
		panic(err)
	}
	page, _ := l.PageBytes(16, 1)
	k, _ := l.PartBytesPerToken(0, 8)
	fmt.Println(l)
	fmt.Println("bytes per 16-token page at attention-TP 1:", page)
	fmt.Println("K bytes per token on one rank of attention-TP 8:", k)
	// Output:
	// layers=32;k=2048:sharded;v=2048:sharded
	// bytes per 16-token page at attention-TP 1: 2097152
	// K bytes per token on one rank of attention-TP 8: 256
}

func ExampleLayout_Diff() {
	mine, _ := kvlayout.Parse("layers=32;k=2048:sharded;v=2048:sharded")
	theirs, _ := kvlayout.Parse("layers=32;k=2048:sharded;v=1024:sharded")
	fmt.Println(mine.Diff(theirs))
	fmt.Println(mine.Fingerprint() == theirs.Fingerprint())
	// Output:
	// part 1 (v): bytes per token 2048 vs 1024
	// false
}

func ExamplePreset() {
	_, err := kvlayout.Preset("llama-3-7b")
	fmt.Println(err)
	mla, _ := kvlayout.Preset("deepseek-v3")
	fmt.Println(mla, mla.AllReplicated())
	// Output:
	// kvlayout: unknown preset "llama-3-7b" (known: deepseek-v3, llama-3-70b, llama-3-8b, llama-3-8b-indexer)
	// layers=61;kv=1152:replicated true
}
