"""The record's vocabulary, shared by the check that writes records and the reports that read them:
metric columns, the details CSV header, the JSON form records travel in from xdist workers."""
