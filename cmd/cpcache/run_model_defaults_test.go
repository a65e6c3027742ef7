package main

import (
	"flag"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cpcache/cpcache/cmd/cpcache/internal/runner"
)

// TestEngineModelDefaults: `run --engine model` without --clients, --rounds or --l1-pages
// serves the model's smaller workload over the model's L1; each of those flags, when given,
// keeps its value; a kvtest run keeps the default workload.
func TestEngineModelDefaults(t *testing.T) {
	parse := func(args ...string) runner.Config {
		fs := flag.NewFlagSet("run", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		o := runFlags(fs)
		require.NoError(t, fs.Parse(args))
		require.NoError(t, o.finish())
		return o.cfg
	}
	c := parse("--engine", "model")
	assert.Equal(t, runner.ModelSynthetic, c.Synthetic)
	assert.Equal(t, runner.ModelL1Pages, c.L1Pages)

	c = parse("--engine", "model", "--clients", "3", "--l1-pages", "40", "--turn-gap", "5ms")
	want := runner.ModelSynthetic
	want.Clients, want.TurnGapMs = 3, 5
	assert.Equal(t, want, c.Synthetic)
	assert.Equal(t, 40, c.L1Pages)

	c = parse("--engine", "model", "--rounds", "2")
	assert.Equal(t, 2, c.Synthetic.Rounds)
	assert.Equal(t, runner.ModelSynthetic.Clients, c.Synthetic.Clients)

	def := runner.DefaultConfig()
	c = parse()
	assert.Equal(t, def.Synthetic, c.Synthetic)
	assert.Equal(t, def.L1Pages, c.L1Pages)
}
