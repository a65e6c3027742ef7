package gloo

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cpcache/cpcache/parallel"
)

func claimValue(id string, expiry time.Time) []byte {
	return []byte(fmt.Sprintf("%s 2 %d job", id, expiry.UnixMilli()))
}

// TestUserKVClaim: of concurrent claimers exactly one takes a claim; it stays taken until
// released or expired; a generation whose taker died between its two calls (taken, no
// value) is walked over once claimValueWait has passed.
func TestUserKVClaim(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u := &userKV{s: parallel.NewMemStore()}
	const key = "cpcache/job-x/claim"
	later := time.Now().Add(time.Hour)

	for round := range 5 {
		var taken atomic.Int32
		var wg sync.WaitGroup
		vals := make([][]byte, 16)
		for i := range vals {
			vals[i] = claimValue(fmt.Sprintf("r%d-%d", round, i), later)
			wg.Go(func() {
				ok, held, err := u.claim(ctx, key, vals[i], later)
				if err != nil {
					t.Error(err)
				}
				if ok {
					taken.Add(1)
				} else if held == nil {
					t.Errorf("round %d: claimer %d refused without the holder's value", round, i)
				}
			})
		}
		wg.Wait()
		if n := taken.Load(); n != 1 {
			t.Fatalf("round %d: %d claimers took the claim, want 1", round, n)
		}
		cur, ok, err := u.claimed(ctx, key)
		if err != nil || !ok {
			t.Fatalf("round %d: no live claim after it was taken (%v)", round, err)
		}
		if err := u.release(ctx, key, cur); err != nil {
			t.Fatal(err)
		}
		if _, ok, _ := u.claimed(ctx, key); ok {
			t.Fatalf("round %d: the claim is live after its release", round)
		}
	}

	// An expired claim is taken over.
	if ok, _, err := u.claim(ctx, key, claimValue("short", time.Now().Add(-time.Second)), time.Now()); !ok || err != nil {
		t.Fatalf("claim: %v %v", ok, err)
	}
	if ok, _, err := u.claim(ctx, key, claimValue("next", later), later); !ok || err != nil {
		t.Fatalf("an expired claim was not taken over: %v %v", ok, err)
	}
	cur, _, _ := u.claimed(ctx, key)
	if err := u.release(ctx, key, cur); err != nil {
		t.Fatal(err)
	}

	// A taker that died after taking its generation, before writing it.
	h, _ := u.hint(ctx, key)
	for g := h; ; g++ {
		if n, _ := u.add(ctx, genKey(key, g)+"#take", 0); n == 0 {
			if _, err := u.add(ctx, genKey(key, g)+"#take", 1); err != nil {
				t.Fatal(err)
			}
			break
		}
	}
	start := time.Now()
	if ok, _, err := u.claim(ctx, key, claimValue("after-dead", later), later); !ok || err != nil {
		t.Fatalf("a dead taker's generation blocks the claim: %v %v", ok, err)
	}
	if d := time.Since(start); d < claimValueWait {
		t.Fatalf("walked over a generation without a value after %v, before claimValueWait", d)
	}
}
