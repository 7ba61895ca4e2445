"""Money: currency signs, ISO codes and scales ('$3.50', 'EUR 3.50', 'a $5bn deal'), and '10M'."""

from __future__ import annotations

import re
from typing import NamedTuple

from api.text.normalize.numbers import INT, NUMBER, Context, cardinal, number_words
from api.text.tracked import Tracked


class _Currency(NamedTuple):
    singular: str
    plural: str
    minor_singular: str | None
    minor_plural: str | None


_CURRENCIES = {
    "$": _Currency("dollar", "dollars", "cent", "cents"),
    "£": _Currency("pound", "pounds", "penny", "pence"),
    "€": _Currency("euro", "euros", "cent", "cents"),
    "¥": _Currency("yen", "yen", None, None),
}
_DOLLAR_CENTS = ("cent", "cents")
# ISO 4217 codes and prefixed signs (`currency_code_normalization`); minor units only where they are said.
_CODE_CURRENCIES = {
    "USD": _Currency("US dollar", "US dollars", *_DOLLAR_CENTS),
    "EUR": _Currency("euro", "euros", *_DOLLAR_CENTS),
    "GBP": _Currency("British pound", "British pounds", "penny", "pence"),
    "JPY": _Currency("yen", "yen", None, None),
    "CHF": _Currency("Swiss franc", "Swiss francs", None, None),
    "CAD": _Currency("Canadian dollar", "Canadian dollars", *_DOLLAR_CENTS),
    "AUD": _Currency("Australian dollar", "Australian dollars", *_DOLLAR_CENTS),
    "NZD": _Currency("New Zealand dollar", "New Zealand dollars", *_DOLLAR_CENTS),
    "HKD": _Currency("Hong Kong dollar", "Hong Kong dollars", *_DOLLAR_CENTS),
    "SGD": _Currency("Singapore dollar", "Singapore dollars", *_DOLLAR_CENTS),
    "INR": _Currency("Indian rupee", "Indian rupees", None, None),
    "CNY": _Currency("Chinese yuan", "Chinese yuan", None, None),
    "SEK": _Currency("Swedish krona", "Swedish kronor", None, None),
    "NOK": _Currency("Norwegian krone", "Norwegian kroner", None, None),
    "DKK": _Currency("Danish krone", "Danish kroner", None, None),
    "MXN": _Currency("Mexican peso", "Mexican pesos", None, None),
    "BRL": _Currency("Brazilian real", "Brazilian reais", None, None),
    "KRW": _Currency("South Korean won", "South Korean won", None, None),
    "ZAR": _Currency("South African rand", "South African rand", None, None),
    "RUB": _Currency("Russian ruble", "Russian rubles", None, None),
    "PLN": _Currency("Polish zloty", "Polish zlotys", None, None),
    "BTC": _Currency("bitcoin", "bitcoin", None, None),
}
_PREFIXED_CURRENCIES = {
    "US$": _CODE_CURRENCIES["USD"], "C$": _CODE_CURRENCIES["CAD"], "A$": _CODE_CURRENCIES["AUD"],
    "HK$": _CODE_CURRENCIES["HKD"], "NZ$": _CODE_CURRENCIES["NZD"], "S$": _CODE_CURRENCIES["SGD"],
    "R$": _CODE_CURRENCIES["BRL"], "₹": _Currency("rupee", "rupees", None, None),
    "₩": _Currency("won", "won", None, None), "₽": _Currency("ruble", "rubles", None, None),
    "₪": _Currency("shekel", "shekels", None, None), "₱": _Currency("peso", "pesos", None, None),
    "₺": _Currency("lira", "lira", None, None),
}  # fmt: skip
_ALL_CURRENCIES = {**_CURRENCIES, **_CODE_CURRENCIES, **_PREFIXED_CURRENCIES}
_SCALES = {
    "k": "thousand",
    "m": "million",
    "mn": "million",
    "b": "billion",
    "bn": "billion",
    "tn": "trillion",
}
_AMOUNT = rf"(?P<amount>{INT})(?:\.(?P<frac>\d+))?"
_SCALE = (
    r"(?:\s?(?P<word>thousand|million|billion|trillion)\b|(?P<abbr>[kKmMbB]|\s?(?:mn|bn|tn))(?![A-Za-z]))?"
)
_MONEY_BEFORE = re.compile(rf"(?P<sign>(?<!\w)[-−])?(?P<cur>[$£€¥])\s?{_AMOUNT}{_SCALE}")
_CODES = "|".join(_CODE_CURRENCIES)
_PREFIXES = "|".join(re.escape(prefix) for prefix in sorted(_PREFIXED_CURRENCIES, key=len, reverse=True))
_CODE_MONEY_BEFORE = re.compile(
    rf"(?P<sign>(?<!\w)[-−])?(?:(?<![A-Za-z])(?P<code>{_CODES})\s?|(?<![A-Za-z$])(?P<prefix>{_PREFIXES})\s?)"
    rf"(?=\d){_AMOUNT}{_SCALE}"
)
_CODE_MONEY_AFTER = re.compile(rf"(?P<sign>(?<!\w)[-−])?(?<![\w.,]){_AMOUNT}\s?(?P<code>{_CODES})\b")
# 'a $5bn deal', 'a $20 bill': an amount used as an adjective takes the singular.
_ARTICLE_BEFORE = re.compile(r"\b[Aa]n?\s+-?$")
_NOUN_AFTER = re.compile(r"\s+(?P<word>[a-z]+)\b")
_NOT_NOUNS = frozenset({
    "of", "in", "on", "for", "to", "and", "or", "per", "each", "a", "an", "the", "is", "was", "from", "at",
    "with", "by", "more", "less", "than", "month", "year", "week", "day", "hour", "night", "off",
})  # fmt: skip
_MONEY_AFTER = re.compile(rf"(?P<sign>(?<!\w)[-−])?(?<![\w.,]){_AMOUNT}\s?(?P<cur>[£€¥])")
_CENTS = re.compile(rf"(?<![\w.,])(?P<amount>{INT})\s?¢")
_SCALED_NUMBER = re.compile(rf"(?<![\w.,$£€¥])(?P<num>{NUMBER})(?P<abbr>M|B|bn|mn|tn)(?![A-Za-z])")


def _count(n: int, singular: str, plural: str, ctx: Context) -> str:
    return f"{cardinal(n, ctx)} {singular if n == 1 else plural}"


def _is_adjective(match: re.Match[str]) -> bool:
    if not _ARTICLE_BEFORE.search(match.string, max(0, match.start() - 4), match.start()):
        return False
    noun = _NOUN_AFTER.match(match.string, match.end())
    return noun is not None and noun["word"] not in _NOT_NOUNS


def _say_money(match: re.Match[str], ctx: Context) -> str:
    """'$3.50' -> 'three dollars and fifty cents', '$2.5m' -> 'two point five million dollars', 'a $5bn
    deal' -> 'a five billion dollar deal'."""
    groups = match.groupdict()
    currency = _ALL_CURRENCIES[groups.get("cur") or groups.get("code") or groups["prefix"]]
    if (groups.get("word") or groups.get("abbr") or not match["frac"]) and _is_adjective(match):
        currency = currency._replace(plural=currency.singular)
    sign = "minus " if match["sign"] else ""
    groups = match.groupdict()
    scale = groups.get("word") or _SCALES.get((groups.get("abbr") or "").strip().lower())
    whole, fraction = match["amount"].replace(",", ""), match["frac"] or ""
    if scale:
        amount = number_words(f"{whole}.{fraction}" if fraction else whole, ctx)
        return f"{sign}{amount} {scale} {currency.plural}"
    if currency.minor_singular is None or currency.minor_plural is None or len(fraction) > 2:
        amount = number_words(f"{whole}.{fraction}" if fraction else whole, ctx)
        return f"{sign}{amount} {currency.singular if whole == '1' and not fraction else currency.plural}"
    minor = int(fraction.ljust(2, "0")) if fraction else 0
    parts = [_count(int(whole), currency.singular, currency.plural, ctx)] if int(whole) or not minor else []
    parts += [_count(minor, currency.minor_singular, currency.minor_plural, ctx)] if minor else []
    return sign + " and ".join(parts)


def expand_currency_codes(text: Tracked, ctx: Context) -> Tracked:
    """'USD 5' -> 'five US dollars', '5 GBP' -> 'five British pounds', 'C$10' -> 'ten Canadian dollars'."""
    text = text.sub(_CODE_MONEY_BEFORE, lambda m: _say_money(m, ctx))
    return text.sub(_CODE_MONEY_AFTER, lambda m: _say_money(m, ctx))


def expand_money(text: Tracked, ctx: Context) -> Tracked:
    text = text.sub(_MONEY_BEFORE, lambda m: _say_money(m, ctx))
    text = text.sub(_MONEY_AFTER, lambda m: _say_money(m, ctx))
    return text.sub(_CENTS, lambda m: _count(int(m["amount"].replace(",", "")), "cent", "cents", ctx))


def expand_scaled_numbers(text: Tracked, ctx: Context) -> Tracked:
    """'10M' -> '10 million', '2.5bn' -> '2.5 billion'. A bare 'K' stays a letter: "a 5K run"."""
    return text.sub(_SCALED_NUMBER, lambda m: f"{m['num']} {_SCALES[m['abbr'].lower()]}")
