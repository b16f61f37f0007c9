"""hardware.check_entries, the one check of a profile's values for library callers and --hw alike:
a count (cores, reads in flight, threads, copies) must be a whole number."""
import json

import pytest

from avsg.lab.costmodel import hardware


def _bundled():
    with open(hardware.DEFAULT_PROFILE) as f:
        return json.load(f)


@pytest.mark.parametrize("key", sorted(hardware.COUNT_KEYS))
def test_a_fractional_count_is_refused_naming_the_entry(key):
    entries = _bundled()
    entries[key]["value"] = 39.5
    with pytest.raises(ValueError, match=f"entry '{key}': expected a whole number"):
        hardware.check_entries(entries, "lib.json")


@pytest.mark.parametrize("key", sorted(hardware.COUNT_KEYS))
def test_a_whole_count_written_as_a_float_is_accepted(key):
    entries = _bundled()
    entries[key]["value"] = float(int(entries[key]["value"]))
    hardware.check_entries(entries, "lib.json")


def test_count_keys_are_entries_of_the_bundled_profile():
    assert hardware.COUNT_KEYS <= set(_bundled())
