package workload

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"

	"github.com/cpcache/cpcache/internal/regfile"
)

// BlockTokens is the number of tokens behind one hash id in a Mooncake trace.
const BlockTokens = 512

// ErrBadTrace is wrapped by every trace parsing error.
var ErrBadTrace = errors.New("workload: bad trace")

// Limits on a trace, checked line by line while it streams in, before a line's tokens exist,
// so that a hostile or corrupt trace is refused before it can exhaust memory.
const (
	MaxTraceLineBytes = 1 << 20 // one line of JSON
	MaxInputTokens    = 1 << 21 // input_length of one request (2 M tokens)
	MaxOutputTokens   = 1 << 20 // output_length of one request (1 M tokens)
	// MaxWorkloadTokens bounds the prompt tokens of a whole workload (trace or synthetic):
	// every rank holds them all, 4 bytes each (1 GiB).
	MaxWorkloadTokens = 1 << 28
)

// TraceOptions tune ReadTrace.
type TraceOptions struct {
	MaxRequests int // stop after this many requests (0: all)
	MaxTokens   int // refuse a trace of more prompt tokens than this (0: MaxWorkloadTokens)
	// Scale divides the trace's lengths (0 or 1: as written): each request's input and
	// output length, rounded up, and the BlockTokens tokens behind a hash id, so that every
	// request keeps its blocks, and so its prefix sharing, at 1/Scale of the size (a run
	// whose engine computes every token, as the reference model does, serves a slice of a
	// real trace in seconds). A power of two up to BlockTokens; a line's limits are checked
	// on its lengths as written.
	Scale int
}

// ErrBadScale is wrapped by the error of a TraceOptions.Scale that is not a power of two
// from 1 to BlockTokens.
var ErrBadScale = errors.New("workload: bad trace scale")

// blockTokens is the tokens behind one hash id at the options' scale.
func (o TraceOptions) blockTokens() (int, error) {
	s := o.Scale
	if s == 0 {
		s = 1
	}
	if s < 1 || s > BlockTokens || s&(s-1) != 0 {
		return 0, fmt.Errorf("%w: %d is not a power of two from 1 to %d (the tokens of a hash id)", ErrBadScale, o.Scale, BlockTokens)
	}
	return BlockTokens / s, nil
}

type traceLine struct {
	Timestamp    *int64   `json:"timestamp"`
	InputLength  *int     `json:"input_length"`
	OutputLength *int     `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"`
	Tenant       *string  `json:"tenant"`
}

// rawTraceLine is a line's fields as they are written, each decoded on its own so that an
// error names the field and its value (a whole-line decode names neither: "cannot unmarshal
// string into Go struct field"). Only a line that fails the whole-line decode takes it.
type rawTraceLine struct {
	Timestamp    json.RawMessage `json:"timestamp"`
	InputLength  json.RawMessage `json:"input_length"`
	OutputLength json.RawMessage `json:"output_length"`
	HashIDs      json.RawMessage `json:"hash_ids"`
	Tenant       json.RawMessage `json:"tenant"`
}

// decodeTraceLine decodes one line; an error names the field and its value.
func decodeTraceLine(text []byte) (traceLine, error) {
	var tl traceLine // unknown extra fields are tolerated
	lineErr := json.Unmarshal(text, &tl)
	if lineErr == nil {
		return tl, nil
	}
	var raw rawTraceLine
	if err := json.Unmarshal(text, &raw); err != nil {
		return traceLine{}, fmt.Errorf("invalid JSON: %v", err)
	}
	for _, f := range []struct {
		name string
		raw  json.RawMessage
		dst  any
	}{{"timestamp", raw.Timestamp, &tl.Timestamp}, {"input_length", raw.InputLength, &tl.InputLength},
		{"output_length", raw.OutputLength, &tl.OutputLength}} {
		if f.raw != nil && json.Unmarshal(f.raw, f.dst) != nil {
			return traceLine{}, fmt.Errorf("invalid JSON: %s %s is not a 64-bit integer", f.name, shortJSON(f.raw))
		}
	}
	if raw.Tenant != nil && json.Unmarshal(raw.Tenant, &tl.Tenant) != nil {
		return traceLine{}, fmt.Errorf("invalid JSON: tenant %s is not a string", shortJSON(raw.Tenant))
	}
	if raw.HashIDs != nil && json.Unmarshal(raw.HashIDs, &tl.HashIDs) != nil {
		var ids []json.RawMessage
		if json.Unmarshal(raw.HashIDs, &ids) != nil {
			return traceLine{}, fmt.Errorf("invalid JSON: hash_ids %s is not an array", shortJSON(raw.HashIDs))
		}
		for i, id := range ids {
			var v uint64
			if json.Unmarshal(id, &v) != nil {
				return traceLine{}, fmt.Errorf("invalid JSON: hash_ids[%d] %s is not an unsigned 64-bit integer", i, shortJSON(id))
			}
		}
	}
	return traceLine{}, fmt.Errorf("invalid JSON: %v", lineErr)
}

// shortJSON is a field's JSON text for an error, cut to 40 bytes.
func shortJSON(raw json.RawMessage) string {
	const max = 40
	if len(raw) > max {
		return string(raw[:max]) + "..."
	}
	return string(raw)
}

// ReadTraceFile reads a Mooncake JSONL trace from path.
func ReadTraceFile(path string, opts TraceOptions) ([]Request, error) {
	f, err := OpenRegularFile(path)
	if err != nil {
		return nil, fmt.Errorf("workload: open trace: %w", err)
	}
	defer f.Close()
	return readTrace(f, opts, path+": ")
}

// ErrNotRegular is wrapped by OpenRegularFile's error for a path that is not a regular file.
var ErrNotRegular = regfile.ErrNotRegular

// OpenRegularFile opens path for reading if it is a regular file (through links) and
// refuses anything else at once: a named pipe (whose open and reads wait for a writer,
// forever if none comes), a directory, a device or a socket. Every rank reads its input
// files again, so a pipe could not feed them all anyway.
func OpenRegularFile(path string) (*os.File, error) {
	f, _, err := regfile.Open(path)
	return f, err
}

// FileKind names the kind of file a mode is, for errors.
func FileKind(m fs.FileMode) string { return regfile.Kind(m) }

// ReadTrace parses a Mooncake trace: one JSON object per line with timestamp (ms),
// input_length, output_length and hash_ids (ids of 512-token blocks; equal id means equal
// prefix up to that block), and optionally tenant (a string: who sent it, for isolation). Block k of a request holds the tokens derived from its id, and
// the prompt is the first input_length tokens of its blocks. A bad line is an error that
// names the line number; nothing is returned for a trace with a bad line among those read.
func ReadTrace(r io.Reader, opts TraceOptions) ([]Request, error) { return readTrace(r, opts, "") }

// readTrace is ReadTrace with where (the source's name and ": ", or "") in its errors.
func readTrace(r io.Reader, opts TraceOptions, where string) ([]Request, error) {
	block, err := opts.blockTokens()
	if err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), MaxTraceLineBytes)
	var reqs []Request
	line, total, maxTokens := 0, 0, opts.MaxTokens
	if maxTokens <= 0 || maxTokens > MaxWorkloadTokens {
		maxTokens = MaxWorkloadTokens
	}
	for sc.Scan() {
		line++
		if opts.MaxRequests > 0 && len(reqs) >= opts.MaxRequests {
			break
		}
		text := sc.Bytes()
		if len(bytes.TrimSpace(text)) == 0 {
			continue
		}
		req, err := parseTraceLine(text, len(reqs), block)
		if err != nil {
			return nil, fmt.Errorf("%w: %sline %d: %v", ErrBadTrace, where, line, err)
		}
		if total += len(req.Tokens); total > maxTokens {
			return nil, fmt.Errorf("%w: %sline %d: the trace holds over %d prompt tokens up to here (the limit of a workload; use --requests to serve fewer)", ErrBadTrace, where, line, maxTokens)
		}
		reqs = append(reqs, req)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("%w: %sline %d is longer than %d bytes (the limit of a line)", ErrBadTrace, where, line+1, MaxTraceLineBytes)
		}
		return nil, fmt.Errorf("%w: %safter line %d: %v", ErrBadTrace, where, line, err)
	}
	if len(reqs) == 0 {
		return nil, fmt.Errorf("%w: %sno requests", ErrBadTrace, where)
	}
	return reqs, nil
}

// parseTraceLine parses one line as request id, each hash id behind block tokens (BlockTokens
// as written; fewer scale every length down by BlockTokens/block).
func parseTraceLine(text []byte, id, block int) (Request, error) {
	tl, err := decodeTraceLine(text)
	if err != nil {
		return Request{}, err
	}
	switch {
	case tl.Timestamp == nil:
		return Request{}, errors.New(`missing "timestamp"`)
	case tl.InputLength == nil:
		return Request{}, errors.New(`missing "input_length"`)
	case tl.OutputLength == nil:
		return Request{}, errors.New(`missing "output_length"`)
	case *tl.Timestamp < 0:
		return Request{}, fmt.Errorf("timestamp %d is negative", *tl.Timestamp)
	case *tl.InputLength <= 0:
		return Request{}, fmt.Errorf("input_length %d must be positive", *tl.InputLength)
	case *tl.InputLength > MaxInputTokens:
		return Request{}, fmt.Errorf("input_length %d is over the limit of %d tokens", *tl.InputLength, MaxInputTokens)
	case *tl.OutputLength < 0:
		return Request{}, fmt.Errorf("output_length %d is negative", *tl.OutputLength)
	case *tl.OutputLength > MaxOutputTokens:
		return Request{}, fmt.Errorf("output_length %d is over the limit of %d tokens", *tl.OutputLength, MaxOutputTokens)
	case len(tl.HashIDs) == 0:
		return Request{}, errors.New(`missing or empty "hash_ids"`)
	case len(tl.HashIDs) > (MaxInputTokens+BlockTokens-1)/BlockTokens:
		return Request{}, fmt.Errorf("%d hash_ids are over the limit of %d (%d tokens of %d-token blocks)", len(tl.HashIDs), (MaxInputTokens+BlockTokens-1)/BlockTokens, MaxInputTokens, BlockTokens)
	case *tl.InputLength > len(tl.HashIDs)*BlockTokens:
		return Request{}, fmt.Errorf("input_length %d exceeds %d hash_ids × %d tokens", *tl.InputLength, len(tl.HashIDs), BlockTokens)
	}
	scale := BlockTokens / block
	tokens := make([]int32, (*tl.InputLength+scale-1)/scale)
	for i := range tokens {
		tokens[i] = BlockToken(tl.HashIDs[i/block], i%block)
	}
	req := Request{ID: id, ArrivalMs: *tl.Timestamp, Tokens: tokens, OutputLen: (*tl.OutputLength + scale - 1) / scale, Client: -1}
	if tl.Tenant != nil {
		req.Tenant = *tl.Tenant
	}
	return req, nil
}

// BlockToken is token j of the block with the given trace hash id.
func BlockToken(hashID uint64, j int) int32 { return token(1, hashID, uint64(j)) }
