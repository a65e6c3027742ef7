package runner

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSelectDeviceSpreadsLocalRanksOverDevices(t *testing.T) {
	for _, c := range []struct{ explicit, local, count, want int }{
		{-1, 0, 8, 0}, {-1, 5, 8, 5}, {-1, 9, 8, 1}, {-1, 7, 1, 0}, {-1, 3, 2, 1}, {2, 7, 4, 2},
	} {
		got, err := SelectDevice(c.explicit, c.local, c.count)
		require.NoError(t, err)
		assert.Equal(t, c.want, got, "explicit %d, local rank %d, %d devices", c.explicit, c.local, c.count)
	}
	_, err := SelectDevice(4, 0, 4)
	assert.ErrorIs(t, err, ErrBadInput)
	assert.ErrorContains(t, err, "--cuda-device 4")
	_, err = SelectDevice(-1, 0, 0)
	assert.ErrorContains(t, err, "no CUDA device")
}

func TestCheckDeviceDefaultsAndRejects(t *testing.T) {
	c := Config{}
	require.NoError(t, c.checkDevice(), "a zero Config is a host run")
	assert.Equal(t, DeviceHost, c.Device)
	assert.Equal(t, L2Host, c.L2)

	c = Config{Device: DeviceCUDA, CUDADevice: -1}
	require.NoError(t, c.checkDevice())
	assert.Equal(t, L2Device, c.L2, "device L2 is the default of a CUDA run")

	for _, bad := range []struct {
		cfg  Config
		want string
	}{
		{Config{Device: "gpu", CUDADevice: -1}, `device "gpu"`},
		{Config{L2: L2Device, CUDADevice: -1}, "--l2 device needs --device cuda"},
		{Config{Device: DeviceCUDA, L2: "nvme", CUDADevice: -1}, `--l2 "nvme"`},
		{Config{Device: DeviceCUDA, CUDADevice: -2}, "--cuda-device -2"},
		{Config{Device: DeviceCUDA, CUDADevice: -1, Storage: "file:///x"}, "--l2 host"},
	} {
		err := bad.cfg.checkDevice()
		assert.True(t, errors.Is(err, ErrBadInput), "%+v: %v", bad.cfg, err)
		assert.ErrorContains(t, err, bad.want)
	}
	c = Config{Device: DeviceCUDA, L2: L2Host, CUDADevice: -1, Storage: "file:///x"}
	assert.NoError(t, c.checkDevice(), "pinned host L2 has host pages for the storage tier")
}

func TestUnionTotalCountsOverlapOnce(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	got := unionTotal([]copyPeriod{
		{at(20), at(30), 100}, // after a gap
		{at(0), at(10), 100},
		{at(5), at(12), 100},  // overlaps the first
		{at(21), at(25), 100}, // inside another
	})
	assert.Equal(t, copyTotal{bytes: 400, busy: 22 * time.Millisecond}, got)
	assert.Equal(t, copyTotal{}, unionTotal(nil))
	assert.InDelta(t, 2.0, gbps(2e9, 1), 1e-9)
	assert.Zero(t, gbps(1, 0))
}

func TestRankBytesCountsOnlyHostMemory(t *testing.T) {
	p := &Plan{Config: Config{L1Pages: 10, L2Pages: 20, PageSize: 4, KVBytesPerToken: 8}}
	for _, c := range []struct {
		device, l2 string
		l1, l2b    int64
	}{
		{DeviceHost, L2Host, 320, 640},
		{DeviceCUDA, L2Host, 0, 640},
		{DeviceCUDA, L2Device, 0, 0},
	} {
		p.Config.Device, p.Config.L2 = c.device, c.l2
		l1, l2, _ := p.RankBytes()
		assert.Equal(t, [2]int64{c.l1, c.l2b}, [2]int64{l1, l2}, "device %s, L2 %s", c.device, c.l2)
	}
}
