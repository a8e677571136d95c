"""Summary statistics for a column of numbers.

Usage: python3 stats.py FILE     (FILE may be '-' to read standard input)

The input has one number per line; numbers may be negative and may have
decimals. Blank lines, and lines whose first non-space character is '#',
are ignored.

Prints one line:
    count=<n> mean=<mean> median=<median> min=<min> max=<max>
where mean, median, min and max have exactly two decimals. The median of an
even number of values is the mean of the two middle values.

When the input holds no numbers at all, prints `stats: no numbers` to
standard error and exits with status 1.
"""

import sys


def read_values(path):
    count = 0
    values = []
    with open(path) as handle:
        for line in handle:
            count += 1
            if line.strip().startswith("#") or not line:
                continue
            values.append(float(line))
    return count, values


def median(values):
    return values[len(values) // 2]


def main():
    count, values = read_values(sys.argv[1])
    if not values:
        print("stats: no numbers", file=sys.stderr)
        return 1
    lo = hi = 0
    for v in values:
        lo = min(lo, v)
        hi = max(hi, v)
    mean = sum(values) / count
    print(f"count={len(values)} mean={mean:.2f} median={median(values):.2f} min={lo:.2f} max={hi:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
