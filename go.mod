module github.com/cpcache/cpcache

go 1.26.0

require (
	github.com/NVIDIA/go-nvml v0.13.4-1
	github.com/stretchr/testify v1.12.1
	golang.org/x/sys v0.50.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/prometheus/client_golang v1.25.0 // indirect
	github.com/redis/go-redis/v9 v9.23.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
)
