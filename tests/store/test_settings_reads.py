"""The ``WEFT_*`` settings are kept once read, and read again once Django's settings are
overridden (docs/reference/settings.md)."""

from __future__ import annotations

from django.conf import settings
from django.test import override_settings

from django_weft.conf import weft_settings


def test_an_override_applies_at_once_and_ends_with_its_block() -> None:
    before = weft_settings.MAX_PAYLOAD_BYTES
    with override_settings(WEFT_MAX_PAYLOAD_BYTES=1234):
        assert weft_settings.MAX_PAYLOAD_BYTES == 1234
    assert before == weft_settings.MAX_PAYLOAD_BYTES


def test_the_settings_fixture_applies_at_once(settings) -> None:  # type: ignore[no-untyped-def]
    settings.WEFT_TICK_BATCH = 7
    assert weft_settings.TICK_BATCH == 7
    del settings.WEFT_TICK_BATCH
    assert weft_settings.TICK_BATCH == 100


def test_a_value_read_once_is_kept_until_a_setting_changes() -> None:
    assert weft_settings.TICK_BATCH == 100
    object.__setattr__(settings._wrapped, "WEFT_TICK_BATCH", 5)  # no signal: not seen
    try:
        assert weft_settings.TICK_BATCH == 100
        with override_settings(WEFT_NOTIFY=False):  # any override: read again
            assert weft_settings.TICK_BATCH == 5
    finally:
        delattr(settings._wrapped, "WEFT_TICK_BATCH")
        with override_settings(WEFT_NOTIFY=True):
            pass
    assert weft_settings.TICK_BATCH == 100


def test_the_engine_config_is_parsed_once_and_again_under_an_override(settings) -> None:  # type: ignore[no-untyped-def]
    config = weft_settings.engine_config()
    assert weft_settings.engine_config() is config  # kept: a turn asks several times
    with override_settings(WEFT_LEASE_TTL="45s", WEFT_RATE_LIMITS={"stripe": "5/s"}):
        inside = weft_settings.engine_config()
        assert inside.lease_ttl == 45.0 and (
            inside.rate_limits["stripe"].limit,
            inside.rate_limits["stripe"].per,
        ) == (5, 1.0)
        assert weft_settings.engine_config() is inside
    assert weft_settings.engine_config().lease_ttl == config.lease_ttl
    settings.WEFT_RETRY_INLINE_MAX_DELAY = 0.5
    assert weft_settings.engine_config().inline_retry_max_delay == 0.5
