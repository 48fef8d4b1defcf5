"""What the run admin (:mod:`..runs`) and the schedule admin (:mod:`..schedules`) share:
display helpers (:mod:`.display`), the one way to name and reverse admin URLs
(:mod:`.urls`), the form fields (:mod:`.forms`), the rows an action applies to
(:mod:`.selection`), the one confirmation flow of their actions (:mod:`.confirmation`) and
the base of their tool pages (:mod:`.tools`). Nothing here imports either of them.
"""
