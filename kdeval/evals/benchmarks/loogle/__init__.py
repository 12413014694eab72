"""LooGLE: a document's questions one sample each (``task``), or asked as turns of one conversation (``turns``)."""
