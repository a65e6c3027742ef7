package nccl

import "fmt"

// DataType is an ncclDataType_t (an ABI fact of nccl.h).
type DataType int

// Data types.
const (
	Int8     DataType = 0
	Uint8    DataType = 1
	Int32    DataType = 2
	Uint32   DataType = 3
	Int64    DataType = 4
	Uint64   DataType = 5
	Float16  DataType = 6
	Float32  DataType = 7
	Float64  DataType = 8
	Bfloat16 DataType = 9
)

var typeInfo = [...]struct {
	name string
	size int
}{{"int8", 1}, {"uint8", 1}, {"int32", 4}, {"uint32", 4}, {"int64", 8}, {"uint64", 8},
	{"float16", 2}, {"float32", 4}, {"float64", 8}, {"bfloat16", 2}}

// Valid reports whether t is one of the constants above.
func (t DataType) Valid() bool { return t >= 0 && int(t) < len(typeInfo) }

// Size is the element size in bytes (0 for an invalid type).
func (t DataType) Size() int {
	if !t.Valid() {
		return 0
	}
	return typeInfo[t].size
}

func (t DataType) String() string {
	if !t.Valid() {
		return fmt.Sprintf("DataType(%d)", int(t))
	}
	return typeInfo[t].name
}

// RedOp is an ncclRedOp_t (built-in reductions only).
type RedOp int

// Reductions.
const (
	Sum  RedOp = 0
	Prod RedOp = 1
	Max  RedOp = 2
	Min  RedOp = 3
	Avg  RedOp = 4 // NCCL >= 2.10
)

// Valid reports whether op is one of the constants above.
func (op RedOp) Valid() bool { return op >= Sum && op <= Avg }

func (op RedOp) String() string {
	switch op {
	case Sum:
		return "sum"
	case Prod:
		return "prod"
	case Max:
		return "max"
	case Min:
		return "min"
	case Avg:
		return "avg"
	}
	return fmt.Sprintf("RedOp(%d)", int(op))
}

// Version is an NCCL version code as ncclGetVersion returns it.
type Version int

// MakeVersion is NCCL_VERSION(major, minor, patch): major*10000+minor*100+patch since 2.9,
// major*1000+minor*100+patch before.
func MakeVersion(major, minor, patch int) Version {
	if major <= 2 && minor <= 8 {
		return Version(major*1000 + minor*100 + patch)
	}
	return Version(major*10000 + minor*100 + patch)
}

// parts splits a version code into major, minor, patch.
func (v Version) parts() (major, minor, patch int) {
	c := int(v)
	if c >= 10000 {
		return c / 10000, c % 10000 / 100, c % 100
	}
	return c / 1000, c % 1000 / 100, c % 100
}

// AtLeast compares versions across both encodings.
func (v Version) AtLeast(major, minor, patch int) bool {
	a, b, c := v.parts()
	if a != major {
		return a > major
	}
	if b != minor {
		return b > minor
	}
	return c >= patch
}

func (v Version) String() string {
	a, b, c := v.parts()
	return fmt.Sprintf("%d.%d.%d", a, b, c)
}
