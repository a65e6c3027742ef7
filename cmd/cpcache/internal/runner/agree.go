package runner

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"strconv"
	"time"

	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/internal/redact"
	"github.com/cpcache/cpcache/parallel"
)

// StartFlag is one setting every rank of a job must share, named by the flag that sets it,
// with its value as the flag would read it.
type StartFlag struct {
	Flag  string `json:"f"`
	Value string `json:"v"`
}

// startFlags are the settings that shape a replica's scheduler or what it serves: the
// layout, capacities and policies, the workload (its flags, its isolation keys and a digest
// of its requests, so that two ranks reading different traces are caught, whatever the
// files' paths), virtual time and its cost model, the storage's behaviour, the KV-event
// endpoints, the consensus backend, the memory and the injected faults, each as the run
// uses it (--world as the launcher gave it, --kv-bytes-per-token as --model made it); then
// every other flag of Config.StartFlags as the command line gave it, so that a flag nobody
// listed here is compared too. Ranks of one replica that differ in any of them make
// different decisions and wait for each other's collectives until the step deadline; ranks
// of different replicas would report a job nobody asked for. Settings that are a rank's own
// (its device ordinal, its key file's and its trace's paths, where the reports go,
// --timeout: cmd/cpcache's per-rank flags) are in neither.
func (p *Plan) startFlags() []StartFlag {
	c := &p.Config
	l := c.Layout
	itoa, btoa := strconv.Itoa, strconv.FormatBool
	t := c.Time
	cost := t.Cost
	isolation := c.Isolation
	if isolation == "" {
		isolation = IsolationNone
	}
	flags := []StartFlag{
		{"--world", itoa(l.World)}, {"--tp", itoa(l.TP)}, {"--dp", itoa(l.DP)}, {"--attn-cp", itoa(l.AttnCP)},
		{"--ep", itoa(l.EP)}, {"--dp-attention", btoa(l.DPAttention)},
		{"--page-size", itoa(c.PageSize)}, {"--l1-pages", itoa(c.L1Pages)}, {"--l2-pages", itoa(c.L2Pages)},
		{"--policy", c.Policy.String()}, {"--kv-bytes-per-token", itoa(c.KVBytesPerToken)},
		{"--model", c.Model}, {"--engine", c.Engine}, {"--model-variant", c.ModelVariant}, {"--separate-l2", btoa(c.SeparateL2)}, {"--l2-layout", c.L2Layout}, {"--l1-buffers", c.L1Buffers},
		{"--batch-tokens", itoa(c.BatchTokens)}, {"--max-running", itoa(c.MaxRunning)},
		{"--workload", c.Workload}, {"--requests", itoa(c.Requests)}, {"--trace-scale", itoa(c.TraceScale)},
		{"--clients", itoa(c.Synthetic.Clients)}, {"--rounds", itoa(c.Synthetic.Rounds)},
		{"--turn-gap", (time.Duration(c.Synthetic.TurnGapMs) * time.Millisecond).String()},
		{"--isolation", isolation},
		{"--time", t.Mode}, {"--speed", strconv.FormatFloat(t.Speed, 'g', -1, 64)},
		{"--cost-profile", cost.Name},
		{"--cost", fmt.Sprintf("%+v", cost)},
		{"--prefetch-sync", btoa(t.PrefetchSync)}, {"--prefetch-always", btoa(c.PrefetchAlways)},
		{"--storage", redact.URL(c.Storage)}, {"--prefetch-policy", c.PrefetchPolicy.String()},
		{"--storage-timeout", c.StorageTimeout.String()}, {"--storage-clear", btoa(c.StorageClear)},
		{"--storage-insecure", btoa(c.StorageInsecure)},
		{"--kv-events", c.KVEvents}, {"--kv-events-replay", c.KVEventsReplay},
		{"--consensus", c.Consensus}, {"--device", c.Device}, {"--l2", c.L2},
		{"--strict", btoa(c.Strict)}, {"--fault", fmt.Sprintf("%+v", c.Faults)},
	}
	named := make(map[string]bool, len(flags))
	for _, f := range flags {
		named[f.Flag] = true
	}
	for _, f := range c.StartFlags {
		if !named[f.Flag] {
			flags = append(flags, f)
		}
	}
	return append(flags, StartFlag{"the workload's requests (" + c.Workload + ")", p.requestsDigest()})
}

// requestsDigest is the number of the plan's requests and a hash of all they hold.
func (p *Plan) requestsDigest() string {
	h := fnv.New64a()
	var b [8]byte
	put := func(v int64) {
		binary.LittleEndian.PutUint64(b[:], uint64(v))
		h.Write(b[:])
	}
	for _, r := range p.Requests {
		put(int64(r.ID))
		put(r.ArrivalMs)
		put(int64(r.OutputLen))
		put(int64(r.Client))
		put(int64(r.Round))
		put(int64(len(r.Key)))
		h.Write([]byte(r.Key))
		put(int64(len(r.Tokens)))
		for _, tok := range r.Tokens {
			binary.LittleEndian.PutUint32(b[:4], uint32(tok))
			h.Write(b[:4])
		}
	}
	return fmt.Sprintf("%d requests (digest %016x)", len(p.Requests), h.Sum64())
}

// agreeStartFlags compares the start flags of every rank of g (the job's world) before
// anything else is built over it, so that ranks started with different flags fail at once,
// each with the same bad input naming the first flag that differs, instead of waiting for
// each other until a collective's deadline.
func agreeStartFlags(ctx context.Context, g parallel.Group, flags []StartFlag) error {
	payload, err := json.Marshal(flags)
	if err != nil {
		return err
	}
	all, err := hicache.AgreeStart(ctx, g, "comparing the ranks' flags", nil, string(payload))
	if err != nil {
		return err
	}
	return compareStartFlags(all, g.Ranks())
}

// compareStartFlags finds the first flag whose value differs from the first rank's.
func compareStartFlags(payloads []string, ranks []int) error {
	decoded := make([][]StartFlag, len(payloads))
	for i, s := range payloads {
		if err := json.Unmarshal([]byte(s), &decoded[i]); err != nil {
			return bad("the flags of rank %d cannot be read (%v): are the ranks the same cpcache?", ranks[i], err)
		}
	}
	first := decoded[0]
	for i, flags := range decoded[1:] {
		rank := ranks[i+1]
		if len(flags) != len(first) {
			return bad("rank %d compares %d flags, rank %d %d: the ranks run different versions of cpcache", ranks[0], len(first), rank, len(flags))
		}
		for k, f := range flags {
			if f.Flag != first[k].Flag {
				return bad("rank %d has flag %s where rank %d has %s: the ranks run different versions of cpcache", rank, f.Flag, ranks[0], first[k].Flag)
			}
			if f.Value != first[k].Value {
				return bad("%s differs between the ranks of the job: %s on rank %d, %s on rank %d (start every rank with the same flags)",
					f.Flag, quoteEmpty(first[k].Value), ranks[0], quoteEmpty(f.Value), rank)
			}
		}
	}
	return nil
}

// quoteEmpty shows an empty value as "" (a flag left at its default of nothing).
func quoteEmpty(v string) string {
	if v == "" {
		return `""`
	}
	return v
}
