"""Sequence's token accessors that the decode path uses instead of building the whole
prompt + output list every step."""

from omni.engines.ar.scheduler import Sequence


def test_token_slice_and_last_token_equal_the_whole_list():
    for prompt, output in [([1, 2, 3, 4], [5, 6, 7]), ([1, 2], []), ([9], [8])]:
        seq = Sequence("s", list(prompt), output=list(output))
        whole = prompt + output
        for start in range(len(whole) + 1):
            for stop in range(start, len(whole) + 1):
                assert seq.token_slice(start, stop) == whole[start:stop], (start, stop)
        assert seq.last_token == whole[-1]
