"""The blind arena's data: labels drawn per turn, votes, the Bradley–Terry
leaderboard with bootstrap intervals, its export and `tandem arena`.

No Qt and no torch anywhere in this package: `tandem arena` reads the chat
store and computes the leaderboard with numpy only.
"""
