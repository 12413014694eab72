"""Running a grid: the service behind submit/resume/cancel, the scheduler loop with its shards, groups and
holds, what each outcome records, progress, recovery of a lost index, and rescoring stored predictions.
"""
