package main

// main is required by -buildmode=c-shared and c-archive; it never runs.
func main() {}
