"""Dialogs opened with open(), never exec(): preferences, the model manager, shortcuts and small ones.
"""
