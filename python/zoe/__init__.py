"""zoe: placeholder"""
