package cudatest

import (
	"os"
	"testing"

	"github.com/cpcache/cpcache/cuda"
)

// RequireEnv is the variable that turns a missing GPU from a skip into a failure.
const RequireEnv = "CPCACHE_REQUIRE_GPU"

// Required reports whether CPCACHE_REQUIRE_GPU=1.
func Required() bool { return os.Getenv(RequireEnv) == "1" }

// Unavailable skips t with reason, or fails it when a GPU is required.
func Unavailable(t testing.TB, reason string) {
	t.Helper()
	if Required() {
		t.Fatalf("%s=1 but no GPU is usable: %s", RequireEnv, reason)
		return
	}
	t.Skipf("no GPU: %s (set %s=1 to make this a failure)", reason, RequireEnv)
}

// RequireGPU opens the driver and device ordinal 0, closing both when the test ends.
func RequireGPU(t testing.TB) (*cuda.Driver, *cuda.Device) {
	t.Helper()
	drv, err := cuda.Open()
	if err != nil {
		Unavailable(t, err.Error())
		return nil, nil
	}
	n, err := drv.DeviceCount()
	if err != nil || n == 0 {
		drv.Close()
		if err == nil {
			Unavailable(t, "driver reports 0 devices")
		} else {
			Unavailable(t, err.Error())
		}
		return nil, nil
	}
	dev, err := drv.Device(0)
	if err != nil {
		drv.Close()
		Unavailable(t, err.Error())
		return nil, nil
	}
	t.Cleanup(func() {
		if err := dev.Close(); err != nil {
			t.Errorf("close device: %v", err)
		}
		drv.Close()
	})
	return drv, dev
}
