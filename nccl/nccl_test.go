package nccl

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/cpcache/cpcache/cuda"
	"github.com/cpcache/cpcache/internal/testenv/fakelib"
	"github.com/cpcache/cpcache/parallel/local"
)

func TestABIConstants(t *testing.T) {
	if UniqueIDSize != 128 || uniqueIDCSize() != 128 {
		t.Errorf("ncclUniqueId size = %d/%d, want 128", UniqueIDSize, uniqueIDCSize())
	}
	for dt, want := range map[DataType]int{Int8: 0, Uint8: 1, Int32: 2, Uint32: 3, Int64: 4, Uint64: 5, Float16: 6, Float32: 7, Float64: 8, Bfloat16: 9} {
		if int(dt) != want {
			t.Errorf("%v = %d, want %d", dt, int(dt), want)
		}
	}
	if Int64.Size() != 8 || Bfloat16.Size() != 2 || DataType(10).Size() != 0 || DataType(10).Valid() {
		t.Errorf("data type sizes wrong")
	}
	if Sum != 0 || Prod != 1 || Max != 2 || Min != 3 || Avg != 4 || RedOp(5).Valid() {
		t.Errorf("ncclRedOp_t values wrong")
	}
	if InProgress != 7 || RemoteError.Name() != "ncclRemoteError" || Result(42).Name() != "ncclResult(42)" {
		t.Errorf("ncclResult_t values/names wrong")
	}
	for _, blocking := range []bool{false, true} {
		c := configV21400(blocking)
		if len(c) != 20 {
			t.Fatalf("config prefix is %d bytes, want 20", len(c))
		}
		if got := binary.LittleEndian.Uint64(c[0:]); got != 20 {
			t.Errorf("config.size = %d, want 20", got)
		}
		if got := binary.LittleEndian.Uint32(c[8:]); got != 0xcafebeef {
			t.Errorf("config.magic = %#x", got)
		}
		if got := binary.LittleEndian.Uint32(c[12:]); got != 21400 {
			t.Errorf("config.version = %d, want 21400", got)
		}
		want := uint32(0)
		if blocking {
			want = 1
		}
		if got := binary.LittleEndian.Uint32(c[16:]); got != want {
			t.Errorf("config.blocking = %d, want %d", got, want)
		}
	}
}

func TestVersion(t *testing.T) {
	if v := MakeVersion(2, 18, 3); v != 21803 || v.String() != "2.18.3" || !v.AtLeast(2, 18, 0) || v.AtLeast(2, 19, 0) {
		t.Errorf("2.18.3: code %d string %s", int(v), v)
	}
	if v := MakeVersion(2, 8, 4); v != 2804 || v.String() != "2.8.4" || v.AtLeast(2, 14, 0) || !v.AtLeast(2, 4, 0) {
		t.Errorf("2.8.4: code %d string %s", int(v), v)
	}
	if !MakeVersion(3, 0, 0).AtLeast(2, 30, 0) {
		t.Errorf("3.0.0 must be >= 2.30.0")
	}
}

func TestSymbolGates(t *testing.T) {
	opt := map[string]string{}
	for _, s := range symbols() {
		if s.Optional {
			opt[s.Name] = s.Since
		}
	}
	want := map[string]string{"ncclCommInitRankConfig": "NCCL 2.14", "ncclCommFinalize": "NCCL 2.14",
		"ncclCommSplit": "NCCL 2.18", "ncclGetLastError": "NCCL 2.13"}
	if fmt.Sprint(opt) != fmt.Sprint(want) {
		t.Errorf("optional symbols = %v, want %v", opt, want)
	}
}

func TestErrorFormatting(t *testing.T) {
	err := check(5, "ncclAllReduce", "8 x int64 sum", nil)
	want := "nccl: ncclAllReduce (8 x int64 sum): failed [ncclInvalidUsage = 5]"
	if err == nil || err.Error() != want {
		t.Errorf("got %v\nwant %s", err, want)
	}
	if !errors.Is(err, InvalidUsage) || errors.Is(err, SystemError) {
		t.Errorf("errors.Is by result is wrong")
	}
	if err := check(notLoadedCode(), "ncclGroupEnd", "", nil); !errors.Is(err, ErrNotLoaded) {
		t.Errorf("not loaded: %v", err)
	}
	if err := checkArgs(-1, Int64, Sum, true); err == nil || !strings.Contains(err.Error(), "negative count -1") {
		t.Errorf("checkArgs count: %v", err)
	}
	if err := checkArgs(1, DataType(77), Sum, true); err == nil || !strings.Contains(err.Error(), "unknown data type 77") {
		t.Errorf("checkArgs type: %v", err)
	}
	if err := checkArgs(1, Int64, RedOp(9), true); err == nil || !strings.Contains(err.Error(), "unknown reduction 9") {
		t.Errorf("checkArgs op: %v", err)
	}
}

// stubLib compiles a fake libnccl exporting every table symbol except omit: version, unique
// id and error strings answer like NCCL, every other call fails with ncclInternalError (3).
func stubLib(t *testing.T, omit ...string) string {
	t.Helper()
	skip := map[string]bool{}
	for _, o := range omit {
		skip[o] = true
	}
	special := map[string]string{
		"ncclGetVersion":     "int ncclGetVersion(int *v) { *v = 21803; return 0; }",
		"ncclGetUniqueId":    "int ncclGetUniqueId(char *id) { for (int i = 0; i < 128; i++) id[i] = (char)(i ^ 0x5a); return 0; }",
		"ncclGetErrorString": `const char *ncclGetErrorString(int r) { return r == 5 ? "invalid usage (run with NCCL_DEBUG=WARN for details)" : "other"; }`,
		"ncclGetLastError":   `const char *ncclGetLastError(void *c) { (void)c; return "stub last error"; }`,
	}
	var names []string
	for _, s := range symbols() {
		if !skip[s.Name] {
			names = append(names, s.Name)
		}
	}
	return fakelib.Stub(t, "libnccl-stub.so.2", names, special, 3)
}

func TestLoadMissingLibrary(t *testing.T) {
	t.Setenv("CPCACHE_NCCL_LIBRARY", "/nonexistent/libnccl.so.2")
	_, err := Open()
	var le *cuda.LoadError
	if !errors.As(err, &le) || !errors.Is(err, cuda.ErrLibraryNotFound) {
		t.Fatalf("want a not-found *cuda.LoadError, got %T %v", err, err)
	}
	for _, want := range []string{"nccl: cannot load libnccl.so.2", "/nonexistent/libnccl.so.2: ", "CPCACHE_NCCL_LIBRARY"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	// NewComm fails the same way before touching the group.
	g := local.World(1, local.Options{})[0]
	if _, err := NewComm(context.Background(), g, nil, Options{}); err == nil || !strings.Contains(err.Error(), "nil group or device") {
		t.Errorf("NewComm with nil device: %v", err)
	}
}

func TestLoadMissingSymbol(t *testing.T) {
	t.Setenv("CPCACHE_NCCL_LIBRARY", stubLib(t, "ncclCommAbort", "ncclCommSplit"))
	_, err := Open()
	if !errors.Is(err, cuda.ErrMissingSymbol) || !strings.Contains(err.Error(), "missing symbol ncclCommAbort (since NCCL 2.4)") {
		t.Fatalf("want missing ncclCommAbort, got %v", err)
	}
	if strings.Contains(err.Error(), "ncclCommSplit") {
		t.Errorf("optional ncclCommSplit reported missing: %v", err)
	}
}

func TestStubLibrary(t *testing.T) {
	t.Setenv("CPCACHE_NCCL_LIBRARY", stubLib(t, "ncclCommSplit"))
	lib, err := Open()
	if err != nil {
		t.Fatal(err)
	}
	defer lib.Close()
	if lib.Version() != 21803 || !lib.Supports("config") || lib.Supports("split") {
		t.Errorf("version %v config %v split %v", lib.Version(), lib.Supports("config"), lib.Supports("split"))
	}
	id, err := lib.NewUniqueID()
	if err != nil || id[0] != 0x5a || id[127] != byte(127^0x5a) {
		t.Errorf("unique id from stub: %v %x..%x", err, id[0], id[127])
	}
	err = check(5, "ncclAllReduce", "", nil)
	want := "nccl: ncclAllReduce: invalid usage (run with NCCL_DEBUG=WARN for details) [ncclInvalidUsage = 5]: stub last error"
	if err == nil || err.Error() != want {
		t.Errorf("got %v\nwant %s", err, want)
	}
	lib.Close()
	if _, err := lib.NewUniqueID(); !errors.Is(err, ErrNotLoaded) {
		t.Errorf("after Close: %v", err)
	}
}

func TestNilObjects(t *testing.T) {
	var c *Comm
	var g *Group
	var l *Library
	if c.Close() != nil || g.Close() != nil || l.Close() != nil || c.Abort() != nil {
		t.Errorf("nil Close/Abort must be no-ops")
	}
	if _, err := c.handle(); !errors.Is(err, ErrClosed) {
		t.Errorf("nil comm handle: %v", err)
	}
}
