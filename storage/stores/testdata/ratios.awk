# ratios.awk summarises BenchmarkDataPath (datapath_bench_test.go), run one or more times
# (-count): for each ratio:NAME metric it prints "ratio NAME MEDIAN" (the median over the
# runs), and for each cost ratio measured at several page sizes (NAME_64KiB, NAME_2MiB) the
# worst of their medians as "ratio NAME VALUE", the figure issue 40's targets name.
/^BenchmarkDataPath\// {
	for (i = 2; i < NF; i++) {
		u = $(i + 1)
		if (u !~ /^ratio:/)
			continue
		name = substr(u, 7)
		if (!(name in n))
			order[++names] = name
		v[name, ++n[name]] = $i + 0
	}
}
function median(name,    k, j, t, a, m) {
	m = n[name]
	for (k = 1; k <= m; k++)
		a[k] = v[name, k]
	for (k = 2; k <= m; k++)
		for (j = k; j > 1 && a[j - 1] > a[j]; j--) {
			t = a[j]; a[j] = a[j - 1]; a[j - 1] = t
		}
	return m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
}
END {
	for (k = 1; k <= names; k++) {
		name = order[k]
		med = median(name)
		printf "ratio %s %.3f\n", name, med
		if (name ~ /_cpu_vs_.*_(64KiB|2MiB)$/) {
			base = name
			sub(/_(64KiB|2MiB)$/, "", base)
			if (!(base in worst) || med > worst[base]) {
				if (!(base in worst))
					border[++bases] = base
				worst[base] = med
			}
		}
	}
	for (k = 1; k <= bases; k++)
		printf "ratio %s %.3f\n", border[k], worst[border[k]]
}
