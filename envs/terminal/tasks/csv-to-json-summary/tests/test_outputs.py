"""Checks /app/summary.json against the known per-region aggregates."""
import json
from pathlib import Path

import pytest

EXPECTED = json.loads(r'''{
 "regions": {
  "North": {
   "orders": 30,
   "units": 179,
   "revenue": 3587.33,
   "top_product": "Gizmo \"Pro\""
  },
  "South": {
   "orders": 26,
   "units": 162,
   "revenue": 2551.38,
   "top_product": "Gadget, large"
  },
  "East": {
   "orders": 36,
   "units": 226,
   "revenue": 2591.55,
   "top_product": "Gadget, large"
  },
  "West": {
   "orders": 28,
   "units": 182,
   "revenue": 2293.36,
   "top_product": "Gizmo \"Pro\""
  }
 },
 "total_revenue": 11023.62
}''')


def summary() -> dict:
    return json.loads(Path("/app/summary.json").read_text())


def test_region_keys():
    assert set(summary()["regions"]) == set(EXPECTED["regions"])


@pytest.mark.parametrize("region", sorted(EXPECTED["regions"]))
def test_region_counts(region):
    got, want = summary()["regions"][region], EXPECTED["regions"][region]
    assert isinstance(got["orders"], int) and isinstance(got["units"], int)
    assert (got["orders"], got["units"]) == (want["orders"], want["units"])


@pytest.mark.parametrize("region", sorted(EXPECTED["regions"]))
def test_region_revenue_and_top_product(region):
    got, want = summary()["regions"][region], EXPECTED["regions"][region]
    assert isinstance(got["revenue"], (int, float))
    assert got["revenue"] == pytest.approx(want["revenue"], abs=0.006)
    assert got["top_product"] == want["top_product"]


def test_total_revenue():
    total = summary()["total_revenue"]
    assert isinstance(total, (int, float))
    assert total == pytest.approx(EXPECTED["total_revenue"], abs=0.006)
