"""Synthetic documents with the world's names, places and addresses, for the NER's training and testing.

The US notes of `synth` taught the model one distribution: Census names in title case, US cities, US
address order. Here surrogates come from `faker`'s locales (first and last names, cities, regions,
streets, building numbers, postcodes and whole addresses in each country's own order, MIT licence),
drawn once per locale with a fixed seed and split 80/20 by value like `synth`'s lists. The forms the
model missed are planted on purpose: single names ("my neighbour Okonkwo"), lowercase and ALL-CAPS
names and cities, diacritics and non-Latin scripts, hyphenated and multi-part surnames (van der, de la,
bin, Ó, Mac), names after prepositions and in lists, East Asian family-first names, addresses in other
countries' orders and their fragments ("Suite 838", a bare postcode, "Puistotie 82").

Documents are `synth`'s records (`{"id", "text", "spans", "genre": "world"}`); every planted NAME or
GEOGRAPHIC_LOCATION span also carries `"form"` (single, lowercase, upper, non-ascii, multi-part, plain)
so a held-out split can be scored per form. Templates are the project's own and split one in seven
held out, like `synth`'s.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass
from functools import lru_cache

from text_deid.ner_training import synth
from text_deid.ner_training.synth import Doc, Filler, Gen, _in_split, _pick, _stable_bucket

# locales with their own names (and mostly their own address data); fallbacks to en_US addresses are kept
# for their names only
LOCALES = [
    "en_US", "en_GB", "en_IE", "en_AU", "en_CA", "en_NZ", "en_IN", "en_NG", "en_PH", "en_KE", "ga_IE",
    "fr_FR", "fr_BE", "fr_CH", "fr_CA", "de_DE", "de_AT", "de_CH", "nl_NL", "nl_BE", "it_IT", "es_ES",
    "es_MX", "es_AR", "es_CO", "es_CL", "pt_BR", "pt_PT", "da_DK", "no_NO", "sv_SE", "fi_FI", "is_IS",
    "pl_PL", "cs_CZ", "sk_SK", "hu_HU", "ro_RO", "hr_HR", "sl_SI", "bg_BG", "et_EE", "lt_LT", "lv_LV",
    "tr_TR", "el_GR", "ru_RU", "uk_UA", "ka_GE", "hy_AM", "az_AZ", "ar_SA", "ar_EG", "fa_IR", "he_IL",
    "hi_IN", "bn_BD", "ta_IN", "ne_NP", "vi_VN", "th_TH", "id_ID", "fil_PH", "zh_CN", "zh_TW", "ja_JP",
    "ko_KR", "yo_NG", "ig_NG", "ha_NG", "zu_ZA", "sw", "tw_GH", "am_ET", "mt_MT", "sq_AL", "sr_BA", "uz_UZ",
]
OWN_ADDRESSES = {
    "en_US", "en_GB", "en_IE", "en_AU", "en_CA", "en_NZ", "en_IN", "en_PH", "fr_FR", "fr_BE", "fr_CH", "fr_CA",
    "de_DE", "de_AT", "de_CH", "nl_NL", "nl_BE", "it_IT", "es_ES", "es_MX", "es_AR", "es_CO", "es_CL", "pt_BR",
    "pt_PT", "da_DK", "no_NO", "sv_SE", "fi_FI", "is_IS", "pl_PL", "cs_CZ", "sk_SK", "hu_HU", "ro_RO", "hr_HR",
    "sl_SI", "bg_BG", "et_EE", "lt_LT", "lv_LV", "tr_TR", "el_GR", "ru_RU", "uk_UA", "ka_GE", "hy_AM", "az_AZ",
    "ar_SA", "ar_EG", "fa_IR", "he_IL", "hi_IN", "bn_BD", "ta_IN", "ne_NP", "vi_VN", "th_TH", "id_ID", "fil_PH",
    "zh_CN", "zh_TW", "ja_JP", "ko_KR", "zu_ZA", "uz_UZ",
}
FAMILY_FIRST = {"zh_CN", "zh_TW", "ja_JP", "ko_KR", "vi_VN", "hu_HU"}
NO_SPACE = {"zh_CN", "zh_TW", "ja_JP"}
# surname particles and prefixes as they are written before a surname
PARTICLES = ["van", "van der", "van den", "van de", "de", "de la", "del", "de los", "da", "das", "do", "dos",
             "di", "du", "le", "la", "von", "von der", "zu", "ter", "ten", "bin", "binti", "bint", "ibn", "ben",
             "al-", "el-", "abu", "Ó", "Ní", "Nic", "Mac", "Mc", "O'", "Fitz", "ap", "St.", "Van", "De", "Di",
             "Le", "La", "Du", "Al-", "El-", "Bin", "Ben", "Mac "]
UNITS = ["Suite {n}", "Ste {n}", "Ste. {n}", "Apt {n}", "Apt. {n}", "Unit {n}", "#{n}", "Flat {n}", "Room {n}",
         "Floor {f}", "{f}. OG", "Wohnung {f}", "piso {f}", "Bus {f}", "app. {n}", "apt {n}{l}", "Unit {f}{l}"]
REGIONS_METHODS = ("administrative_unit", "state", "region", "province", "county", "prefecture")


@dataclass
class Locale:
    name: str
    first: list[str]
    last: list[str]
    cities: list[str]
    regions: list[str]
    streets: list[str]  # street name with its building number, in the locale's order
    postcodes: list[str]
    addresses: list[str]  # whole addresses, lines joined by ", "


def _draw(fake, method: str, n: int) -> list[str]:
    fn = getattr(fake, method, None)
    if fn is None:
        return []
    out: dict[str, None] = {}
    for _ in range(n * 3):
        try:
            v = " ".join(str(fn()).split())
        except Exception:  # a provider without this kind of data
            return []
        if v:
            out[v] = None
        if len(out) >= n:
            break
    return list(out)


def _one_line(address: str) -> str:
    return ", ".join(" ".join(line.split()) for line in address.splitlines() if line.strip())


@lru_cache(maxsize=2)
def world_locales(split: str) -> list[Locale]:
    from faker import Faker

    out = []
    for i, loc in enumerate(LOCALES):
        try:
            fake = Faker(loc)
        except AttributeError:  # a locale this faker version does not ship
            continue
        fake.seed_instance(1000 + i)
        if loc == "it_IT":  # its city list is built from a set: ordered by string hashes, which change per process
            for provider in fake.get_providers():
                if isinstance(getattr(provider, "cities", None), list):
                    provider.cities = sorted(provider.cities)
        keep = lambda vs: [v for v in vs if _in_split(v, split)]  # noqa: E731
        first = keep(_draw(fake, "first_name", 300))
        last = [v for v in keep(_draw(fake, "last_name", 300)) if " " not in v or loc == "ga_IE"]
        if loc in OWN_ADDRESSES:
            cities = keep(_draw(fake, "city", 150))
            regions = next((r for m in REGIONS_METHODS if (r := keep(_draw(fake, m, 40)))), [])
            streets = keep(_draw(fake, "street_address", 150))
            postcodes = keep(_draw(fake, "postcode", 80))
            addresses = keep(_one_line(a) for a in _draw(fake, "address", 120))
        else:
            cities = regions = streets = postcodes = addresses = []
        if first and last:
            out.append(Locale(loc, first, last, cities, regions, streets, postcodes, addresses))
    return out


@lru_cache(maxsize=2)
def _latin_weights(split: str) -> list[int]:
    """Latin-script locales three times as often as others (most text the adapter sees is in Latin script)."""
    return [3 if all(ord(c) < 0x250 for c in loc.first[0] + loc.last[0]) else 1 for loc in world_locales(split)]


def form_of(value: str) -> str:
    """The form a planted span stands for (the first that applies)."""
    if not value.isascii():
        return "non-ascii"
    letters = [c for c in value if c.isalpha()]
    if letters and value == value.lower():
        return "lowercase"
    if len(letters) > 1 and value == value.upper():
        return "upper"
    if len(value.split()) == 1 and "-" not in value and "'" not in value:
        return "single"
    if "-" in value or "'" in value or len(value.replace(",", " ").split()) >= 3:
        return "multi-part"
    return "plain"


class WorldGen:
    """Surrogates of one document: most from one locale (a family, a town), some from anywhere."""

    def __init__(self, rng: random.Random, split: str):
        self.rng, self.split = rng, split
        locs = world_locales(split)
        self.locs, self.weights = locs, _latin_weights(split)
        self.home = rng.choices(locs, weights=self.weights)[0]
        self.addr_locs = [x for x in locs if x.cities and x.streets]

    def loc(self, need_address: bool = False) -> Locale:
        r = self.rng
        if (not need_address or self.home.cities) and r.random() < 0.7:
            return self.home
        if need_address:
            return _pick(r, self.addr_locs)
        return r.choices(self.locs, weights=self.weights)[0]

    # ---- people
    def surname(self, loc: Locale) -> str:
        r = self.rng
        last = _pick(r, loc.last)
        x = r.random()
        if loc.name in NO_SPACE:
            return last
        if x < 0.12:
            p = _pick(r, PARTICLES)
            return f"{p}{last}" if p.endswith(("-", "'")) or p == "Mac" and r.random() < 0.5 else f"{p} {last}"
        if x < 0.22:
            return f"{last}-{_pick(r, _pick(r, [loc, loc, self.loc()]).last)}"
        if x < 0.28 and loc.name.startswith(("es_", "pt_")):
            return f"{last} {_pick(r, loc.last)}"
        return last

    def person(self, style: str | None = None) -> str:
        r = self.rng
        loc = self.loc()
        first, last = _pick(r, loc.first), self.surname(loc)
        style = style or r.choices(["fl", "f", "l", "fml", "lf", "fi", "ffl"], weights=[40, 18, 12, 8, 8, 6, 8])[0]
        if loc.name in NO_SPACE and style in ("fl", "fml", "ffl", "lf"):
            return f"{last}{first}" if r.random() < 0.7 else f"{last} {first}"
        if loc.name in FAMILY_FIRST and style == "fl" and r.random() < 0.6:
            return f"{last} {first}"
        i = r.choice("ABCDEFGHIJKLMNOPRSTVWZ")
        return {"fl": f"{first} {last}", "f": first, "l": last, "fml": f"{first} {i}{_pick(r, ['.', '', '.'])} {last}",
                "lf": f"{last}, {first}", "fi": f"{first} {i}.", "ffl": f"{first} {_pick(r, loc.first)} {last}"}[style]

    # ---- places
    def city(self) -> str:
        loc = self.loc(need_address=True)
        return _pick(self.rng, loc.cities)

    def region(self) -> str:
        r = self.rng
        locs = [x for x in self.addr_locs if x.regions]
        loc = self.home if self.home.regions and r.random() < 0.6 else _pick(r, locs)
        return _pick(r, loc.regions)

    def street(self) -> str:
        return _pick(self.rng, self.loc(need_address=True).streets)

    def postcode(self) -> str:
        r = self.rng
        locs = [x for x in self.addr_locs if x.postcodes]
        loc = self.home if self.home.postcodes and r.random() < 0.6 else _pick(r, locs)
        return _pick(r, loc.postcodes)

    def unit(self) -> str:
        r = self.rng
        return _pick(r, UNITS).format(n=r.randint(1, 999), f=r.randint(1, 30), l=r.choice("ABCDEF"))

    def address(self) -> str:
        r = self.rng
        loc = self.loc(need_address=True)
        x = r.random()
        if x < 0.55:
            return _pick(r, loc.addresses)
        if x < 0.8:
            code = f"{_pick(r, loc.postcodes)} " if loc.postcodes else ""
            return f"{_pick(r, loc.streets)}, {code}{_pick(r, loc.cities)}"
        return f"{_pick(r, loc.streets)}, {self.unit()}, {_pick(r, loc.cities)}"


def _recase(rng: random.Random, value: str) -> str:
    x = rng.random()
    if x < 0.14:
        return value.lower()
    if x < 0.24:
        return value.upper()
    return value


# Slots (PHI): {N} a name in any form, {N1} one token of a name, {NL} a lowercase name, {NU} an ALL-CAPS name,
# {NS} a list of two or three names, {C} a city, {CU} an ALL-CAPS city, {RG} a region, {STR} street with its
# number, {UNIT} "Suite 838", {PC} a bare postcode, {WADDR} a whole address in its country's order, {WEMAIL} an
# email made from a name; plus every `synth` slot and filler ({DATE}, {PHONE}, {drug}, {cond}, ...).
GENERAL_TEMPLATES = [
    "My name is {N1}.", "my name is {NL}", "Hi, I'm {N1} from {C}.", "Hello {N1}, thanks for the update.",
    "Dear {N1},", "Dear {N},\nPlease find attached the form.", "Thanks {N1}!", "thanks {NL}, see you then",
    "I live at {STR}, {PC} {C}.", "Send the letter to {WADDR}.", "Ship to: {N}\n{WADDR}", "Address: {WADDR}",
    "Our office moved to {UNIT}, {STR}.", "The clinic is at {STR}, {UNIT}.", "Postcode: {PC}", "zip {PC}",
    "The code for that area is {PC}.", "{N} moved to {C} in {year}.", "{N} grew up in {C} before moving to {CU}.",
    "The parcel left {CU} on {DATE}.", "Born in {C}, {RG}.", "She was born in {C} and lives in {RG} now.",
    "Written by {N} and {N}.", "Directed by: {N}", "cc: {NS}", "Met with {NS} yesterday.", "Attendees: {NS}.",
    "The review was written by {N}, who lives in {C}.", "According to {N1}, the meeting is on {wday}.",
    "I went with {N1} and {N1} to {C}.", "This is for {N1}.", "Got a message from {N1} this morning.",
    "Please forward it to {N1}.", "Ask {NL} about the keys.", "Call {N1} at {PHONE}.", "{N} ({WEMAIL})",
    "Contact: {N}, {PHONE}, {WEMAIL}", "{NU}\n{WADDR}", "Flight from {C} to {C} on {DATE}.",
    "{N1} said the train from {CU} was late.", "we stayed with {NL} in {C}", "My neighbour {N1} has the spare key.",
    "Her friend {N1} drove her home.", "Signed, {N}", "-- {N1}", "Regards,\n{N}", "From: {N} <{WEMAIL}>",
    "The account holder is {NU}, {STR}, {C}.", "Delivery to {STR} {UNIT} failed.", "{C}, {PC}",
    "Meet me at {STR} near {C} station.", "{N1} and I are visiting {C} and {C} next month.",
    "The house at {STR} was sold to {N}.", "Lives in {C} ({RG}).", "Apartment in {C}, {RG}, {PC}.",
]
CLINICAL_WORLD_TEMPLATES = [
    "Pt {N} seen today with her daughter {N1}.", "Lives alone at {WADDR}.", "Neighbour {N1} found pt on the floor.",
    "Pt's neighbor, {N1}, called 911.", "Seen with {N1} ({rel}).", "Spoke with {N1} ({rel}) by phone at {PHONE}.",
    "Dr. {N1} reviewed the {lab}.", "Patient: {NU}\nDOB: {DATEF}", "Address: {STR}, {UNIT}, {C} {PC}",
    "Transferred from {C}, {RG}, for {proc}.", "pt {NL} c/o {cond}", "{NU}, {NU} - {cond}", "Family: {NS}.",
    "Emergency contact: {N} ({rel}), {PHONE}.", "Recently returned from {C}; {cond} suspected.",
    "Pt from {CU}, speaks little English; interpreter {N1} present.", "Seen by {N1}, {cred}, on {DATE}.",
    "{N} is a {AGE}-year-old {sex} with {dx} who lives in {C}.", "Pt {N1} on {drug} for {cond}.",
    "Per {N1}, pt has taken {gdrug} since {year}.", "Discussed plan with {N1} and {N1}.",
    "Home address {WADDR}; postcode {PC}.", "Referred by Dr. {N} in {C}.", "Visited by {NS} today.",
    "Pt {N} ({AGE}{sexabbr}) admitted with {dx}.", "{rel2} {N1} at bedside.",
]
WORLD_SLOTS = {"N", "N1", "NL", "NU", "NS", "C", "CU", "RG", "STR", "UNIT", "PC", "WADDR", "WEMAIL"}
_ASCII = re.compile(r"[^a-z0-9]")


def _world_templates(split: str) -> list[str]:
    ts = GENERAL_TEMPLATES + CLINICAL_WORLD_TEMPLATES
    held = [t for t in ts if _stable_bucket(t, 7) == 0]
    return held if split == "heldout" else [t for t in ts if _stable_bucket(t, 7) != 0]


class WorldFiller(Filler):
    def __init__(self, g: Gen, w: WorldGen):
        super().__init__(g)
        self.w = w

    def slot(self, name: str, doc: Doc) -> None:
        if name not in WORLD_SLOTS:
            return super().slot(name, doc)
        w, r = self.w, self.r
        if name == "NS":
            names = [_recase(r, w.person(r.choice(["fl", "f", "f", "l"]))) for _ in range(r.randint(2, 3))]
            for k, n in enumerate(names):
                if k:
                    doc.add(_pick(r, [", ", " and ", " & "]) if k == len(names) - 1 else ", ")
                _add(doc, n, "NAME")
            return
        value, cat = {
            "N": lambda: (_recase(r, w.person()), "NAME"),
            "N1": lambda: (_recase(r, w.person(r.choice(["f", "f", "l"]))), "NAME"),
            "NL": lambda: (w.person(r.choice(["f", "fl", "l"])).lower(), "NAME"),
            "NU": lambda: (w.person(r.choice(["fl", "lf", "l"])).upper(), "NAME"),
            "C": lambda: (_recase(r, w.city()), "GEOGRAPHIC_LOCATION"),
            "CU": lambda: (w.city().upper(), "GEOGRAPHIC_LOCATION"),
            "RG": lambda: (w.region(), "GEOGRAPHIC_LOCATION"),
            "STR": lambda: (w.street(), "GEOGRAPHIC_LOCATION"),
            "UNIT": lambda: (w.unit(), "GEOGRAPHIC_LOCATION"),
            "PC": lambda: (w.postcode(), "GEOGRAPHIC_LOCATION"),
            "WADDR": lambda: (w.address(), "GEOGRAPHIC_LOCATION"),
            "WEMAIL": lambda: (self._email(), "EMAIL_ADDRESS"),
        }[name]()
        _add(doc, value, cat)

    def _email(self) -> str:
        r = self.r
        loc = _pick(r, self.w.locs)
        user = "".join(_ASCII.sub("", x.lower()) for x in (_pick(r, loc.first), _pick(r, loc.last))) or "user"
        host = _pick(r, ["gmail.com", "web.de", "mail.ru", "yahoo.fr", "outlook.com", "libero.it"])
        return f"{user}{r.randint(1, 99) if r.random() < 0.4 else ''}@{host}"


def _add(doc: Doc, value: str, cat: str) -> None:
    doc.add(value, cat)
    if value and cat in ("NAME", "GEOGRAPHIC_LOCATION"):
        doc.forms = getattr(doc, "forms", {})  # part index -> form, for scoring per form
        doc.forms[len(doc.parts) - 1] = form_of(value)


def make_world_doc(rng: random.Random, split: str, idx: int) -> dict:
    g = Gen(rng, split)
    w = WorldGen(rng, split)
    # a world doc's other names and places (the `synth` slots) come from the world too
    g.first = lambda: _pick(rng, w.loc().first)  # type: ignore[method-assign]
    g.last = lambda: w.surname(w.loc())  # type: ignore[method-assign]
    g.city = w.city  # type: ignore[method-assign]
    f = WorldFiller(g, w)
    doc = Doc()
    tpl = _world_templates(split)
    for k in range(rng.choice([1, 1, 2, 2, 3, 4])):
        if k:
            doc.add(_pick(rng, [" ", "\n", " ", "\n\n"]))
        x = rng.random()
        if x < 0.12:
            synth._negative_sentence(f, doc)
        elif x < 0.2:
            synth._random_sentence(f, doc)
        else:
            f.fill(_pick(rng, tpl), doc)
    case = "upper" if rng.random() < 0.03 else "keep"
    text, spans = doc.render(case)
    forms = getattr(doc, "forms", {})
    k = 0
    for i, (_, cat) in enumerate(doc.parts):
        if cat is None:
            continue
        if i in forms:
            spans[k]["form"] = "upper" if case == "upper" and forms[i] != "non-ascii" else forms[i]
        k += 1
    return {"id": f"synth-{split}-world-{idx:06d}", "text": text, "spans": spans, "genre": "world"}


def generate_world(n: int, seed: int, split: str = "heldout") -> list[dict]:
    rng = random.Random(f"{seed}:{split}:world")
    return [make_world_doc(rng, split, i) for i in range(n)]


def generate(n: int, seed: int, split: str = "train", world: int = 0) -> list[dict]:
    """`synth.generate(n, seed, split)` with `world` world documents (their own random stream) spread evenly
    among its documents, which do not change."""
    docs = synth.generate(n, seed, split)
    if not world:
        return docs
    extra, total = generate_world(world, seed, split), len(docs) + world
    slots = {round(k * total / world) for k in range(world)}
    it_w, it_d = iter(extra), iter(docs)
    return [next(it_w) if i in slots else next(it_d) for i in range(total)]
