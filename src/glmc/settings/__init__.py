"""What every alignment method can be set to, declared once, with each setting's range.

    ranges.py   the vocabulary of ranges (`setting(default, "count")`) and the checks generated from the
                declarations: `setting_problems` for the config check, `check_settings` for constructors
    groups.py   settings groups several methods share: the symmetry classes, learned matching's and the
                learned universe refinement's training settings
    methods.py  one config dataclass per method (`matcher.<name>`), METHODS and MULTI_METHODS, and the
                `matcher` schema built from them

The config schema (glmc.config) and the matchers (glmc.matching) both read this package, and it imports
neither of them: nothing here imports a matcher, torch or glmc.config.
"""
