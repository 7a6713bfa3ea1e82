"""The listener-side numbers of a spoken answer."""

from omni.media.playback import PlaybackClock


def test_in_time_packets_have_no_underrun_and_rtf_below_one():
    clock = PlaybackClock(start=0.0)
    clock.text(now=0.1)
    clock.audio(1.0, now=0.3)   # plays 0.3 .. 1.3
    clock.audio(1.0, now=1.0)   # arrives while the first still plays
    clock.text(now=1.1)         # later text does not move TTFT
    summary = clock.summary(now=1.2)
    assert summary == {"ttft_s": 0.1, "ttfp_s": 0.3, "e2el_s": 1.2, "rtf": 0.5,
                       "underrun_s": 0.0}


def test_a_late_packet_is_the_worst_deficit():
    clock = PlaybackClock(start=0.0)
    clock.audio(0.5, now=1.0)   # plays 1.0 .. 1.5
    clock.audio(0.5, now=2.25)  # 0.75 s late
    clock.audio(0.5, now=2.5)   # by the schedule of the first packet: 0.5 s late
    assert clock.summary(now=3.0)["underrun_s"] == 0.75


def test_no_audio_gives_no_ttfp_or_rtf():
    summary = PlaybackClock(start=0.0).summary(now=1.0)
    assert summary["ttfp_s"] is None and summary["rtf"] is None and summary["e2el_s"] == 1.0
