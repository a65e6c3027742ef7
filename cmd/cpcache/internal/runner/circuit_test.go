package runner

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/sim/sched"
	"github.com/cpcache/cpcache/storage"
	"github.com/cpcache/cpcache/workload"
)

// stoppingStore is a store that stops: its prefetch queries (Exists without present: how
// much of a prefix is stored), except those that start at a key of pass, wait until Stop;
// from Stop on, every call fails at once, as a stopped server's refused connections do.
type stoppingStore struct {
	storage.Storage
	pass    map[storage.Key]bool
	stopped chan struct{}
	once    sync.Once
}

func newStoppingStore(st storage.Storage, pass map[storage.Key]bool) *stoppingStore {
	return &stoppingStore{Storage: st, pass: pass, stopped: make(chan struct{})}
}

var errStoreStopped = fmt.Errorf("%w: the test stopped the store", storage.ErrUnavailable)

// Stop fails every waiting and later call.
func (s *stoppingStore) Stop() { s.once.Do(func() { close(s.stopped) }) }

// check returns the error of a call now, after waiting for Stop when it must.
func (s *stoppingStore) check(ctx context.Context, wait bool) error {
	if wait {
		select {
		case <-s.stopped:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	select {
	case <-s.stopped:
		return errStoreStopped
	default:
		return nil
	}
}

func (s *stoppingStore) Exists(ctx context.Context, keys []storage.Key, present []bool) (int, error) {
	if err := s.check(ctx, present == nil && len(keys) > 0 && !s.pass[keys[0]]); err != nil {
		return 0, err
	}
	return s.Storage.Exists(ctx, keys, present)
}

func (s *stoppingStore) Get(ctx context.Context, keys []storage.Key, dst [][]byte, found []bool) (int, error) {
	if err := s.check(ctx, false); err != nil {
		return 0, err
	}
	return s.Storage.Get(ctx, keys, dst, found)
}

func (s *stoppingStore) GetBound(ctx context.Context, keys []storage.Key, binds []storage.Binding, dst [][]byte, found []bool) (int, error) {
	if err := s.check(ctx, false); err != nil {
		return 0, err
	}
	return s.Storage.GetBound(ctx, keys, binds, dst, found)
}

func (s *stoppingStore) Put(ctx context.Context, keys []storage.Key, src [][]byte) error {
	if err := s.check(ctx, false); err != nil {
		return err
	}
	return s.Storage.Put(ctx, keys, src)
}

func (s *stoppingStore) PutBound(ctx context.Context, keys []storage.Key, binds []storage.Binding, src [][]byte) error {
	if err := s.check(ctx, false); err != nil {
		return err
	}
	return s.Storage.PutBound(ctx, keys, binds, src)
}

func (s *stoppingStore) Delete(ctx context.Context, keys []storage.Key) error {
	if err := s.check(ctx, false); err != nil {
		return err
	}
	return s.Storage.Delete(ctx, keys)
}

func (s *stoppingStore) Clear(ctx context.Context) error {
	if err := s.check(ctx, false); err != nil {
		return err
	}
	return s.Storage.Clear(ctx)
}

// TestStoreStopsWhilePrefetchesWait: the store stops, and the storage circuit opens, while
// every conversation's second turn waits in the queue for its prefetch; the group agrees all
// those prefetches over (misses) at one step. Each turn's history, back in L1 from its first
// turn, fills L1 (its 13 pages × 4 conversations of a replica = the 52 L1 pages), and what a
// waiting request's read brought stays held (locked) until its prefill. The prefill of the
// first turn in the queue then finds L1 full of the others' holds: the holds must give way
// for good until it is in, or no step moves any more (the ranks would step forever, the
// failure TestRunRedisStoppedMidRun in cmd/cpcache guards against too). Every rank of every
// replica must end its loop at the same step with every request served and no prefetch
// entry left; CP4, and CP2 × DP2.
func TestStoreStopsWhilePrefetchesWait(t *testing.T) {
	layouts := map[string]parallel.LayoutConfig{
		"cp4":    {World: 4, DP: 1, AttnCP: 4, DPAttention: true},
		"cp2dp2": {World: 4, DP: 2, AttnCP: 2, DPAttention: true},
	}
	for name, lc := range layouts {
		t.Run(name, func(t *testing.T) {
			replicas := lc.DP
			const perReplica = 4 // conversations of one replica
			p := smallPlan(t, lc, func(c *Config) {
				c.Storage = "mem://runner-test-" + t.Name()
				// A first turn is 96 prompt + 8 answer tokens: 13 pages of 8, its history.
				c.Synthetic = workload.SyntheticConfig{Clients: perReplica * replicas, Rounds: 3, QuestionTokens: 96, AnswerTokens: 8, Seed: 7}
				c.PageSize, c.L1Pages, c.L2Pages, c.KVBytesPerToken = 8, perReplica*13, 256, 8
			})
			// The first turns' queries are answered; the second turns' wait until the store
			// stops. Every rank queries the pages it owns, so a rank's query of a first turn
			// starts at one of that turn's pages (its first own one), and a second turn's
			// (beyond its history, back in L1) at a page past every first turn's: a prefix
			// longer than any first-turn prompt.
			ns, err := p.StorageNamespace()
			require.NoError(t, err)
			firstTurnPages := map[storage.Key]bool{}
			for _, r := range p.Requests {
				if r.Round != 0 {
					continue
				}
				for _, h := range hicache.PrefixHashes(r.Tokens, p.Config.PageSize) {
					firstTurnPages[storage.PageKey(ns, h, 0)] = true // the cache's key: the page id and the TP shard (0)
				}
			}
			stores := make([]*stoppingStore, lc.World)
			stopped := make([]int, lc.World) // queries waiting when the store stopped
			out := runInProcessWith(t, p, inProcessOptions{
				corruptRank: -1,
				wrapStorage: func(rank int, st storage.Storage) storage.Storage {
					stores[rank] = newStoppingStore(st, firstTurnPages)
					return stores[rank]
				},
				afterSchedule: func(rank int, s *sched.Scheduler) func(context.Context) error {
					return func(ctx context.Context) error {
						if stopped[rank] > 0 {
							return nil
						}
						waiting := s.PrefetchesReading()
						if s.Counts().Requests < perReplica || waiting < perReplica || s.Running() > 0 {
							return nil
						}
						// Every first turn finished; every second turn waits for storage.
						stopped[rank] = waiting
						stores[rank].Stop()
						for s.PrefetchesReading() > 0 { // the group agrees the misses (replicated)
							if err := s.Step(ctx); err != nil {
								return err
							}
						}
						return nil
					}
				},
			})
			requireAgreed(t, p, out)
			for rank, o := range out {
				leader := p.Layout.ReplicaGroup(rank)[0]
				assert.Equal(t, perReplica, stopped[rank], "rank %d: the store stopped while every second turn waited for it", rank)
				assert.Equal(t, out[leader].counts.Steps, o.counts.Steps, "rank %d ends its loop at its replica's step", rank)
				assert.Zero(t, o.prefetchesLeft, "rank %d: no prefetch entry left", rank)
				assert.Zero(t, o.prefetchHeld, "rank %d: no prefetch weight left", rank)
				if leader == rank {
					assert.Equal(t, int64(perReplica*3), o.counts.Requests, "replica of rank %d serves its requests", rank)
				}
				assert.True(t, o.stats.StorageCircuitOpen, "rank %d: the group agreed the circuit open", rank)
			}
		})
	}
}
