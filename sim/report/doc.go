// Package report is what a simulated serving run measured, for a person and for a program:
// the report's figures, its text and JSON, the latency figures in virtual time with the
// cache on and off, the hit-rate timeline, the consensus-latency histogram, the miss causes,
// the reference hit rates of the workload, the HTML report with its charts and the table of
// a sweep. It takes plain values: it knows nothing of ranks, layouts or flags.
package report
