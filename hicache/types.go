package hicache

import (
	"github.com/cpcache/cpcache/hicache/core"
	"github.com/cpcache/cpcache/hicache/engine"
	"github.com/cpcache/cpcache/hicache/hostengine"
)

// The driver's API speaks the core's types; these aliases let a scheduler use package
// hicache alone. Their documentation is in package core (the state machine) and package
// engine (the copy-engine interface).
type (
	Handle         = core.Handle
	PageID         = core.PageID // a page's identity: its 256-bit chained hash (core/hash.go)
	NodeInfo       = core.NodeInfo
	NodeState      = core.NodeState
	Request        = core.Request
	MatchResult    = core.MatchResult
	InsertResult   = core.InsertResult
	FillPage       = core.FillPage
	LoadResult     = core.LoadResult
	PrefetchResult = core.PrefetchResult
	// PrefetchOutcome and PrefetchRefusal: how a finished prefetch ended (Cache.PrefetchOutcome).
	PrefetchOutcome = core.PrefetchOutcome
	PrefetchRefusal = core.PrefetchRefusal
	PrefetchCost    = core.PrefetchCost
	Options         = core.Options
	L1Mode          = core.L1Mode
	Policy          = core.Policy
	PrefetchPolicy  = core.PrefetchPolicy
	CoreStats       = core.Stats
	Transfer        = core.Transfer
	Copy            = core.Copy
	Kind            = core.Kind

	Engine            = engine.Engine
	Ticket            = engine.Ticket
	L1Memory          = engine.L1Memory
	StepSubmitter     = engine.StepSubmitter
	StreamWaiter      = engine.StreamWaiter
	HostSlabs         = engine.HostSlabs
	HostEngine        = hostengine.Engine
	HostEngineOptions = hostengine.Options
)

// Write policies (see core.Policy).
const (
	CacheOwned            = core.CacheOwned  // the cache picks L1 slots (default)
	EngineOwned           = core.EngineOwned // the engine's allocator picks them: InsertSlots, LoadBackSlots
	WriteThrough          = core.WriteThrough
	WriteThroughSelective = core.WriteThroughSelective
	WriteBack             = core.WriteBack
)

// Prefetch policies (see core.PrefetchPolicy).
const (
	PrefetchBestEffort   = core.PrefetchBestEffort
	PrefetchWaitComplete = core.PrefetchWaitComplete
	PrefetchTimeout      = core.PrefetchTimeout
)

// Prefetch refusals (see core.PrefetchRefusal).
const (
	RefusedNone        = core.RefusedNone
	RefusedQuota       = core.RefusedQuota
	RefusedNoRoom      = core.RefusedNoRoom
	RefusedTreeChanged = core.RefusedTreeChanged
	RefusedDuplicate   = core.RefusedDuplicate
	RefusedRevoked     = core.RefusedRevoked
	RefusedCut         = core.RefusedCut
	RefusedShort       = core.RefusedShort
	RefusedBelowMin    = core.RefusedBelowMin
	RefusedCost        = core.RefusedCost
)

// HandleIDBits is the width of the node id in a Handle (see core.Handle).
const HandleIDBits = core.HandleIDBits

// Transfer kinds (see core.Kind).
const (
	Write = core.Write
	Load  = core.Load
)

// Node states (see core.NodeState).
const (
	StateL1      = core.StateL1
	StateL2      = core.StateL2
	StateWriting = core.StateWriting
	StateLoading = core.StateLoading
	StateStale   = core.StateStale
)

var (
	// ParsePolicy parses a write policy name (see core.ParsePolicy).
	ParsePolicy = core.ParsePolicy
	// ParsePrefetchPolicy parses a prefetch policy name (see core.ParsePrefetchPolicy).
	ParsePrefetchPolicy = core.ParsePrefetchPolicy
	// PrefixHashes returns the page ids of tokens (see core.PrefixHashes).
	PrefixHashes = core.PrefixHashes
	// KeyPrefixHashes returns the page ids of tokens under an isolation key (see
	// core.KeyPrefixHashes).
	KeyPrefixHashes = core.KeyPrefixHashes
	// KeyRoot is the chain value before a sequence's first page under an isolation key.
	KeyRoot = core.KeyRoot
	// TokenDigest is the digest of one page's tokens that an L3 value binds (core.Binding).
	TokenDigest = core.TokenDigest
	// NewHostEngine makes the host-memory copy engine (see hostengine.New).
	NewHostEngine = hostengine.New
)
