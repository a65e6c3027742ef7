package workload

import (
	"fmt"
)

// SyntheticConfig sizes the built-in multi-turn conversation workload, modelled on SGLang's
// multi-turn benchmark: each client holds a conversation of Rounds turns; turn r's prompt is
// the whole history (every earlier question and answer) plus a new question, so later turns
// repeat ever longer prefixes. An optional system prompt is shared by every client.
type SyntheticConfig struct {
	Clients        int
	Rounds         int
	SystemTokens   int // shared by all clients (0: none)
	QuestionTokens int
	AnswerTokens   int // output length of every turn
	Seed           uint64
	// TurnGapMs spreads the arrivals: client c's turn r arrives at r×TurnGapMs +
	// c×TurnGapMs/Clients ms (each conversation asks every TurnGapMs, the clients evenly
	// staggered over one gap). 0: turn r of every client arrives at r ms (all at once).
	TurnGapMs int64
}

// MaxTurnGapMs bounds SyntheticConfig.TurnGapMs (an hour).
const MaxTurnGapMs = 3_600_000

// DefaultSynthetic is the workload `cpcache run` serves by default.
var DefaultSynthetic = SyntheticConfig{Clients: 32, Rounds: 6, SystemTokens: 256, QuestionTokens: 384, AnswerTokens: 64, Seed: 1}

// validate reports the first field that cannot be used.
func (c SyntheticConfig) validate() error {
	switch {
	case c.Clients < 1:
		return fmt.Errorf("workload: clients %d must be positive", c.Clients)
	case c.Rounds < 1:
		return fmt.Errorf("workload: rounds %d must be positive", c.Rounds)
	case c.SystemTokens < 0:
		return fmt.Errorf("workload: system tokens %d is negative", c.SystemTokens)
	case c.QuestionTokens < 1:
		return fmt.Errorf("workload: question tokens %d must be positive", c.QuestionTokens)
	case c.AnswerTokens < 0:
		return fmt.Errorf("workload: answer tokens %d is negative", c.AnswerTokens)
	case c.TurnGapMs < 0 || c.TurnGapMs > MaxTurnGapMs:
		return fmt.Errorf("workload: turn gap %d ms is outside 0..%d ms", c.TurnGapMs, MaxTurnGapMs)
	case c.Clients > maxClients:
		return fmt.Errorf("workload: clients %d is over the limit of %d", c.Clients, maxClients)
	case c.Rounds > maxRounds:
		return fmt.Errorf("workload: rounds %d is over the limit of %d", c.Rounds, maxRounds)
	case c.SystemTokens > MaxInputTokens || c.QuestionTokens > MaxInputTokens || c.AnswerTokens > MaxOutputTokens:
		return fmt.Errorf("workload: system %d, question %d, answer %d tokens: over the limit of %d input or %d output tokens",
			c.SystemTokens, c.QuestionTokens, c.AnswerTokens, MaxInputTokens, MaxOutputTokens)
	}
	// Every field is bounded above, so these products fit an int64.
	rounds, turn := int64(c.Rounds), int64(c.QuestionTokens+c.AnswerTokens)
	if conv := int64(c.SystemTokens) + rounds*turn; conv > 1<<24 {
		return fmt.Errorf("workload: a conversation of %d tokens is longer than 16M tokens", conv)
	}
	// Turn r's prompt is the system prompt, r earlier turns and a question.
	perClient := rounds*int64(c.SystemTokens+c.QuestionTokens) + turn*rounds*(rounds-1)/2
	if total := int64(c.Clients) * perClient; total > MaxWorkloadTokens {
		return fmt.Errorf("workload: %d clients × %d rounds make %d prompt tokens, over the limit of %d", c.Clients, c.Rounds, total, MaxWorkloadTokens)
	}
	return nil
}

// Bounds of a synthetic workload beyond MaxWorkloadTokens, so its arithmetic cannot overflow.
const (
	maxClients = 1 << 20
	maxRounds  = 1 << 16
)

// Synthetic returns the requests of the workload in issue order: round by round, every
// client's turn r before any turn r+1, so a turn arrives after the previous one finished.
func Synthetic(c SyntheticConfig) ([]Request, error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	system := make([]int32, c.SystemTokens)
	for i := range system {
		system[i] = token(2, c.Seed, uint64(i))
	}
	history := make([][]int32, c.Clients)
	for cl := range history {
		history[cl] = system
	}
	var reqs []Request
	for r := 0; r < c.Rounds; r++ {
		for cl := 0; cl < c.Clients; cl++ {
			prompt := make([]int32, 0, len(history[cl])+c.QuestionTokens+c.AnswerTokens)
			prompt = append(prompt, history[cl]...)
			for j := 0; j < c.QuestionTokens; j++ {
				prompt = append(prompt, token(3, c.Seed, uint64(cl), uint64(r), uint64(j)))
			}
			arrival := int64(r)
			if c.TurnGapMs > 0 {
				arrival = int64(r)*c.TurnGapMs + int64(cl)*c.TurnGapMs/int64(c.Clients)
			}
			req := Request{ID: len(reqs), ArrivalMs: arrival, Tokens: prompt, OutputLen: c.AnswerTokens, Client: cl, Round: r}
			reqs = append(reqs, req)
			history[cl] = append(prompt[:len(prompt):len(prompt)], Answer(req)...)
		}
	}
	return reqs, nil
}

// Answer is the deterministic sequence of tokens "decoded" for req: a function of its prompt
// length and last tokens, so every rank decodes the same answer.
func Answer(req Request) []int32 {
	out := make([]int32, req.OutputLen)
	var last uint64
	if n := len(req.Tokens); n > 0 {
		last = uint64(uint32(req.Tokens[n-1]))
	}
	for i := range out {
		out[i] = token(4, last, uint64(len(req.Tokens)), uint64(i))
	}
	return out
}
