"""hostring.text.unsendable_at against a brute-force oracle: the first character outside printable ASCII."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hostring.text import unsendable_at


def _oracle(text: str) -> int | None:
    for i, ch in enumerate(text, 1):
        if not 32 <= ord(ch) <= 126:
            return i
    return None


@given(st.text(alphabet=st.characters(max_codepoint=0x2100), max_size=40))
def test_unsendable_at_names_the_first_character_a_header_cannot_carry(text: str) -> None:
    assert unsendable_at(text) == _oracle(text)


def test_unsendable_at_examples() -> None:
    assert unsendable_at("hostring/0.1 (+https://x)") is None
    assert unsendable_at("bot/1.0\r\nX-Evil: 1") == 8
    assert unsendable_at("bot (café)") == 9
    assert unsendable_at("tab\there") == 4
