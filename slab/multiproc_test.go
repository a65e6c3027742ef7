package slab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cpcache/cpcache/gloo"
	"github.com/cpcache/cpcache/internal/testenv/glootest"
	"github.com/cpcache/cpcache/internal/testenv/multiproc"
	"github.com/cpcache/cpcache/parallel"
)

// Multi-process tests: 8 rank processes (re-executions of this test binary) joined by a Gloo
// world group over a file store. Parameters travel in CPCACHE_TEST_* variables.

func TestMain(m *testing.M) { multiproc.Main(m) }

func init() {
	for name, fn := range map[string]func(context.Context, *gloo.Group) error{
		"slab-share":             roleShare,
		"slab-mismatch":          roleMismatch,
		"slab-kill-after-setup":  roleKillAfterSetup,
		"slab-kill-during-setup": roleKillDuringSetup,
	} {
		multiproc.Register(name, glootest.Role(30*time.Second, fn))
	}
}

const mpRanks = 8

func envInt(name string) int {
	v, err := strconv.Atoi(os.Getenv(name))
	if err != nil {
		return -1
	}
	return v
}

func mpSpec() Spec { return hostSpec(os.Getenv("CPCACHE_TEST_TAG")) }

func mpEnv(t *testing.T, tag string, extra ...string) []string {
	return append([]string{"CPCACHE_STORE=file://" + t.TempDir(), "CPCACHE_TEST_TAG=" + tag}, extra...)
}

func checkNoLeftovers(tag string) error {
	if m := leftovers(tag); len(m) != 0 {
		return fmt.Errorf("segments still named: %v", m)
	}
	return nil
}

func roleShare(ctx context.Context, g *gloo.Group) error {
	s, err := OpenSet(ctx, g, mpSpec())
	if err != nil {
		return err
	}
	defer s.Close()
	if err := checkNoLeftovers(s.Spec().Tag); err != nil {
		return fmt.Errorf("after OpenSet: %w", err)
	}
	return writeOwnReadAll(ctx, s)
}

func roleMismatch(ctx context.Context, g *gloo.Group) error {
	spec := mpSpec()
	if g.Rank() == envInt("CPCACHE_TEST_ODD") {
		spec.PageSize *= 2
	}
	s, err := OpenSet(ctx, g, spec)
	if err == nil {
		s.Close()
		return errors.New("OpenSet succeeded with a mismatched spec")
	}
	if !errors.Is(err, ErrSpecMismatch) {
		return fmt.Errorf("want ErrSpecMismatch, got %w", err)
	}
	return multiproc.Report([]byte(err.Error()))
}

func killSelf() {
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}

// roleKillAfterSetup: every rank opens the set and writes its slab; rank CPCACHE_TEST_KILL
// then dies by SIGKILL; the others see it lost and exit cleanly.
func roleKillAfterSetup(ctx context.Context, g *gloo.Group) error {
	s, err := OpenSet(ctx, g, mpSpec())
	if err != nil {
		return err
	}
	defer s.Close()
	if err := writeOwnReadAll(ctx, s); err != nil {
		return err
	}
	if g.Rank() == envInt("CPCACHE_TEST_KILL") {
		killSelf()
	}
	if err := g.Barrier(ctx); !errors.Is(err, parallel.ErrPeerLost) {
		return fmt.Errorf("barrier after rank %d died: %v, want ErrPeerLost", envInt("CPCACHE_TEST_KILL"), err)
	}
	return nil
}

// roleKillDuringSetup: rank CPCACHE_TEST_KILL dies by SIGKILL after the handle exchange,
// before mapping; the survivors must fail and remove every segment name, its too.
func roleKillDuringSetup(ctx context.Context, g *gloo.Group) error {
	kill := envInt("CPCACHE_TEST_KILL")
	testHookAfterExchange = func(rank int) error {
		if rank == kill {
			killSelf()
		}
		return nil
	}
	s, err := OpenSet(ctx, g, mpSpec())
	if err == nil {
		s.Close()
		return errors.New("OpenSet succeeded although a rank died during setup")
	}
	if !errors.Is(err, parallel.ErrPeerLost) {
		return fmt.Errorf("want ErrPeerLost, got %w", err)
	}
	return nil
}

func skipMultiproc(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test skipped in -short mode")
	}
}

func TestMultiprocEveryRankReadsEveryPeersSlab(t *testing.T) {
	skipMultiproc(t)
	tag := uniqueTag(t)
	multiproc.Run(t, multiproc.Spec{Role: "slab-share", N: mpRanks, Timeout: 2 * time.Minute, Env: mpEnv(t, tag)})
	if left := leftovers(tag); len(left) != 0 {
		t.Fatalf("segments left: %v", left)
	}
}

func TestMultiprocMismatchedSpecFailsEveryRankAlike(t *testing.T) {
	skipMultiproc(t)
	tag := uniqueTag(t)
	res := multiproc.Run(t, multiproc.Spec{Role: "slab-mismatch", N: mpRanks, Timeout: 2 * time.Minute,
		Env: mpEnv(t, tag, "CPCACHE_TEST_ODD=5")})
	if t.Failed() {
		return
	}
	first := string(res[0].Report)
	for _, r := range res[1:] {
		if string(r.Report) != first {
			t.Fatalf("rank %d's error differs from rank 0's:\n%s\n%s", r.Rank, r.Report, first)
		}
	}
	if !strings.Contains(first, "rank 5 (global 5) has page size 8192 (majority 4096)") {
		t.Fatalf("error does not name rank 5 and its page size: %s", first)
	}
	if left := leftovers(tag); len(left) != 0 {
		t.Fatalf("segments left: %v", left)
	}
}

func TestMultiprocRankKilledAfterSetupLeavesNothing(t *testing.T) {
	runKilled(t, "slab-kill-after-setup", 3, "")
}

func TestMultiprocRankKilledDuringSetupLeavesNothing(t *testing.T) {
	runKilled(t, "slab-kill-during-setup", 6, " during setup")
}

// runKilled runs role, in which rank kill dies by SIGKILL, and checks that the others exit
// cleanly and no segment of the set is left behind.
func runKilled(t *testing.T, role string, kill int, when string) {
	skipMultiproc(t)
	tag := uniqueTag(t)
	res := multiproc.Start(t, multiproc.Spec{Role: role, N: mpRanks, Timeout: 2 * time.Minute,
		Env: mpEnv(t, tag, fmt.Sprintf("CPCACHE_TEST_KILL=%d", kill))})()
	checkKilled(t, res, kill)
	if left := leftovers(tag); len(left) != 0 {
		t.Fatalf("segments left after rank %d was killed%s: %v", kill, when, left)
	}
}

// checkKilled: rank kill died of SIGKILL, every other rank exited 0.
func checkKilled(t *testing.T, res []multiproc.Result, kill int) {
	t.Helper()
	for _, r := range res {
		if r.Rank == kill {
			if !r.KilledBy(syscall.SIGKILL) {
				t.Errorf("rank %d should have been killed, got %v\n%s", r.Rank, r.Err, r.Output)
			}
			continue
		}
		if r.Err != nil {
			t.Errorf("rank %d: %v\n%s", r.Rank, r.Err, r.Output)
		}
	}
}
