"""api_specs loading and the user's msprobe_specs overrides; which API names exist (stage 0: every
later stage reads the specs)."""
