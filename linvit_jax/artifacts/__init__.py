"""What a run leaves for its users: the exported student folder (student.npz,
student.safetensors, student_config.json, its model card) and `load_student` that reads it back.
May import runtime, models, data and evaluation's results record; no trainer and no driver.
"""
