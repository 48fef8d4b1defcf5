"""Schedule specs: cron in a time zone across the 2027 DST changes, intervals with an
offset, start/end bounds, deterministic jitter, and the errors for bad specs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from django_weft.engine.schedule_spec import InvalidSchedule, ScheduleSpec

OSLO = ZoneInfo("Europe/Oslo")
NEW_YORK = ZoneInfo("America/New_York")


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)


def local(zone: ZoneInfo, *parts: int, fold: int = 0) -> datetime:
    return datetime(*parts, tzinfo=zone, fold=fold).astimezone(UTC)


def test_cron_in_utc() -> None:
    spec = ScheduleSpec.build(cron="15 9 * * mon-fri")
    # 2027-01-01 is a Friday.
    assert spec.fire_times(utc(2027, 1, 1), 3) == [
        utc(2027, 1, 1, 9, 15),
        utc(2027, 1, 4, 9, 15),
        utc(2027, 1, 5, 9, 15),
    ]
    assert spec.next_after(utc(2027, 1, 1, 9, 15)) == utc(2027, 1, 4, 9, 15)  # strictly after


def test_seconds_field_leads() -> None:
    spec = ScheduleSpec.build(cron="30 0 12 * * *")
    assert spec.next_after(utc(2027, 6, 1)) == utc(2027, 6, 1, 12, 0, 30)


@pytest.mark.parametrize(
    ("alias", "after", "expected"),
    [
        ("@hourly", utc(2027, 5, 5, 10, 20), utc(2027, 5, 5, 11)),
        ("@daily", utc(2027, 5, 5, 10, 20), utc(2027, 5, 6)),
        ("@midnight", utc(2027, 5, 5, 10, 20), utc(2027, 5, 6)),
        ("@weekly", utc(2027, 5, 5, 10, 20), utc(2027, 5, 9)),  # Sunday
        ("@monthly", utc(2027, 5, 5, 10, 20), utc(2027, 6, 1)),
        ("@yearly", utc(2027, 5, 5, 10, 20), utc(2028, 1, 1)),
        ("@annually", utc(2027, 5, 5, 10, 20), utc(2028, 1, 1)),
    ],
)
def test_aliases(alias: str, after: datetime, expected: datetime) -> None:
    assert ScheduleSpec.build(cron=alias).next_after(after) == expected


def test_oslo_spring_forward_skips_the_missing_time() -> None:
    # 2027-03-28 02:00 -> 03:00 in Europe/Oslo: 02:30 does not exist that day.
    spec = ScheduleSpec.build(cron="30 2 * * *", timezone="Europe/Oslo")
    assert spec.fire_times(utc(2027, 3, 26), 3) == [
        local(OSLO, 2027, 3, 26, 2, 30),
        local(OSLO, 2027, 3, 27, 2, 30),
        local(OSLO, 2027, 3, 29, 2, 30),
    ]


def test_oslo_fall_back_fires_the_repeated_time_once() -> None:
    # 2027-10-31 03:00 -> 02:00 in Europe/Oslo: 02:00-02:59 happens twice.
    spec = ScheduleSpec.build(cron="30 2 * * *", timezone="Europe/Oslo")
    times = spec.fire_times(utc(2027, 10, 30), 3)
    assert times == [
        local(OSLO, 2027, 10, 30, 2, 30),
        local(OSLO, 2027, 10, 31, 2, 30, fold=0),  # the first 02:30 (CEST, 00:30 UTC)
        local(OSLO, 2027, 11, 1, 2, 30),
    ]
    assert times[1] == utc(2027, 10, 31, 0, 30)
    # Asked from inside the second pass of the repeated hour: nothing more that day.
    assert spec.next_after(utc(2027, 10, 31, 1, 15)) == local(OSLO, 2027, 11, 1, 2, 30)


def test_oslo_half_hourly_through_both_changes() -> None:
    spec = ScheduleSpec.build(cron="*/30 * * * *", timezone="Europe/Oslo")
    spring = [
        t.astimezone(OSLO).strftime("%H:%M%z") for t in spec.between(utc(2027, 3, 28, 0), utc(2027, 3, 28, 2))
    ]
    assert spring == ["01:00+0100", "01:30+0100", "03:00+0200", "03:30+0200", "04:00+0200"]
    autumn = [
        t.astimezone(OSLO).strftime("%H:%M%z")
        for t in spec.between(utc(2027, 10, 30, 23), utc(2027, 10, 31, 3))
    ]
    # Each wall-clock time once: the second 02:00 and 02:30 (+0100) do not fire.
    assert autumn == [
        "01:00+0200",
        "01:30+0200",
        "02:00+0200",
        "02:30+0200",
        "03:00+0100",
        "03:30+0100",
        "04:00+0100",
    ]


def test_new_york_both_changes() -> None:
    # 2027-03-14 02:00 -> 03:00 and 2027-11-07 02:00 -> 01:00 in America/New_York.
    spec = ScheduleSpec.build(cron="30 1,2 * * *", timezone="America/New_York")
    spring = spec.fire_times(utc(2027, 3, 13, 12), 4)
    assert [t.astimezone(NEW_YORK).strftime("%m-%d %H:%M%z") for t in spring] == [
        "03-14 01:30-0500",
        "03-15 01:30-0400",  # 02:30 on the 14th does not exist
        "03-15 02:30-0400",
        "03-16 01:30-0400",
    ]
    autumn = spec.fire_times(utc(2027, 11, 6, 12), 4)
    assert [t.astimezone(NEW_YORK).strftime("%m-%d %H:%M%z") for t in autumn] == [
        "11-07 01:30-0400",  # the first 01:30; the second (-0500) does not fire
        "11-07 02:30-0500",
        "11-08 01:30-0500",
        "11-08 02:30-0500",
    ]


def test_interval_with_offset_ignores_time_zones() -> None:
    spec = ScheduleSpec.build(every="1h", offset="5m", timezone="Europe/Oslo")
    assert spec.fire_times(utc(2027, 3, 28, 0, 5), 3) == [
        utc(2027, 3, 28, 1, 5),
        utc(2027, 3, 28, 2, 5),
        utc(2027, 3, 28, 3, 5),
    ]
    day = list(spec.between(utc(2027, 10, 31), utc(2027, 10, 31, 23, 59)))
    assert len(day) == 24  # every hour of the day, DST or not
    assert spec.describe() == "every 1h at +5m"


def test_interval_every_second_and_exact_boundaries() -> None:
    spec = ScheduleSpec.build(every=1)
    assert spec.next_after(utc(2027, 1, 1, 0, 0, 0)) == utc(2027, 1, 1, 0, 0, 1)
    assert spec.next_after(utc(2027, 1, 1) + timedelta(microseconds=1)) == utc(2027, 1, 1, 0, 0, 1)
    assert len(list(spec.between(utc(2027, 1, 1), utc(2027, 1, 1, 0, 1)))) == 61  # both ends inclusive


def test_start_and_end_bounds() -> None:
    spec = ScheduleSpec.build(cron="0 * * * *", start_at=utc(2027, 1, 1, 10, 30), end_at=utc(2027, 1, 1, 13))
    assert spec.next_after(utc(2027, 1, 1)) == utc(2027, 1, 1, 11)
    assert list(spec.between(utc(2026, 1, 1), utc(2028, 1, 1))) == [
        utc(2027, 1, 1, 11),
        utc(2027, 1, 1, 12),
        utc(2027, 1, 1, 13),
    ]
    assert spec.next_after(utc(2027, 1, 1, 13)) is None
    exact = ScheduleSpec.build(every="1h", start_at=utc(2027, 1, 1, 10))
    assert exact.next_after(utc(2026, 12, 1)) == utc(2027, 1, 1, 10)  # start_at itself is a fire time


def test_jitter_is_deterministic_and_bounded() -> None:
    spec = ScheduleSpec.build(every="1m", jitter="30s")
    times = list(spec.between(utc(2027, 1, 1), utc(2027, 1, 1, 5)))
    delays = [spec.jitter_for("nightly", t) for t in times]
    assert delays == [spec.jitter_for("nightly", t) for t in times]  # same in every process
    assert all(timedelta(0) <= d < timedelta(seconds=30) for d in delays)
    assert len(set(delays)) > len(delays) // 2  # spread, not one constant
    assert max(delays) > timedelta(seconds=20) and min(delays) < timedelta(seconds=10)
    assert delays != [spec.jitter_for("other", t) for t in times]  # per schedule
    assert ScheduleSpec.build(every="1m").jitter_for("nightly", times[0]) == timedelta(0)


@pytest.mark.parametrize(
    ("options", "message", "field"),
    [
        ({}, "exactly one of cron= ", "cron"),
        ({"cron": "* * * * *", "every": 60}, "exactly one of cron= ", "cron"),
        ({"cron": "61 * * * *"}, "invalid cron expression", "cron"),
        ({"cron": "* * *"}, "has 3 field(s)", "cron"),
        ({"cron": "0 0 0 1 1 * 2027"}, "has 7 field(s)", "cron"),
        ({"cron": "@reboot"}, "unsupported cron alias", "cron"),
        ({"cron": "@reboot"}, "or 6 with a leading seconds field", "cron"),
        ({"cron": "0 0 30 2 *"}, "never matches a date", "cron"),
        ({"cron": 5}, "cron must be a string", "cron"),
        ({"cron": "* * * * *", "timezone": "Europe/Atlantis"}, "unknown time zone 'Europe/Atl", "timezone"),
        ({"cron": "* * * * *", "timezone": ""}, "IANA time zone name", "timezone"),
        ({"cron": "* * * * *", "offset": "5m"}, "offset= applies to every=", "offset"),
        ({"every": "0.5s"}, "at least 1 second", "every"),
        ({"every": "1h", "offset": "2h"}, "shorter than the interval", "offset"),
        ({"every": "soon"}, "every", "every"),
        ({"every": 60, "start_at": utc(2027, 1, 2), "end_at": utc(2027, 1, 1)}, "before start_at", "end_at"),
        ({"every": 60, "start_at": datetime(2027, 1, 1)}, "must be timezone-aware", "start_at"),
        ({"every": 60, "jitter": -1}, "jitter", "jitter"),
    ],
)
def test_bad_specs_say_what_to_fix(options: dict, message: str, field: str) -> None:
    with pytest.raises(InvalidSchedule) as caught:
        ScheduleSpec.build(**options)
    assert message in str(caught.value)
    assert caught.value.field == field


@pytest.mark.parametrize(
    "options",
    [
        {"every": 60},
        {"cron": "* * * * *"},
        {"cron": "0 0 1 1 *", "timezone": "America/Los_Angeles"},
        {"cron": "0 0 1 1 *", "timezone": "Pacific/Kiritimati"},
    ],
)
def test_no_fire_time_past_year_9999(options: dict) -> None:
    """Times a datetime cannot hold are not fire times: the schedule ends there."""
    last = utc(9999, 12, 31, 23, 59, 30)
    assert ScheduleSpec.build(**options).next_after(last) is None
    assert ScheduleSpec.build(**options, start_at=last).next_after(utc(2027, 1, 1)) is None
    day = list(ScheduleSpec.build(**options).between(utc(9999, 12, 31), last))
    assert len(day) <= 1440
    first = datetime.min.replace(tzinfo=UTC)
    assert ScheduleSpec.build(**options, start_at=first).next_after(utc(2027, 1, 1)) is not None
    assert list(ScheduleSpec.build(**options).between(first, first)) in ([], [first])


@pytest.mark.parametrize(
    ("cron", "zone"),
    [
        ("*/15 2 * * *", "Europe/Berlin"),  # in the hour clocks skip and repeat
        ("30 1 * * *", "America/Santiago"),
        ("*/20 * * * * *", "Australia/Lord_Howe"),  # a half-hour change, seconds
        ("15 1 * 3,10,11 sun", "Europe/London"),
        ("0 0 29 2 *", "UTC"),
    ],
)
def test_times_after_goes_on_as_next_after_from_each_time(cron: str, zone: str) -> None:
    spec = ScheduleSpec.build(cron=cron, timezone=zone, end_at=datetime(2029, 1, 1, tzinfo=UTC))
    for start in (datetime(2026, 3, 20, tzinfo=UTC), datetime(2026, 10, 25, 0, 59, tzinfo=UTC)):
        stepped: list[datetime] = []
        moment = spec.next_after(start)
        while moment is not None and len(stepped) < 2000:
            stepped.append(moment)
            moment = spec.next_after(moment)
        assert spec.fire_times(start, 2000) == stepped
    assert list(spec.times_after(datetime(2028, 12, 31, 23, 59, tzinfo=UTC)))[-1:] <= [spec.end_at]
